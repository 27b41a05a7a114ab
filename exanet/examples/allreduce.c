/* Allreduce from C over a group of ranks, one thread per member attached from this process
 * (in a real program each member is its own process on its own node).
 *
 *   allreduce auto|accel|software NODE [NODE...]
 *
 * Every member contributes 32 doubles (member i: i + 1 + k / 4 in element k); every member
 * checks it got the sums, prints its modeled clock, and the program exits 0 when all did.
 * Build: cc -std=c11 -I exanet/include allreduce.c target/debug/libexanet.a -lpthread -ldl -lm
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "exanet.h"

#define N 32
#define MAX_MEMBERS 64

static int path;
static int count;
static exanet_endpoint *eps[MAX_MEMBERS];
static exanet_member_t members[MAX_MEMBERS];

struct job {
    int index;
    int failed;
};

static void *member(void *arg) {
    struct job *j = arg;
    exanet_collectives *c = NULL;
    exanet_group *g = NULL;
    int rc = exanet_collectives_open(eps[j->index], &c);
    if (rc == EXANET_OK) rc = exanet_group_create(c, 1, members, (uint32_t)count, &g);
    double in[N], out[N];
    for (int k = 0; k < N; k++) in[k] = j->index + 1 + k / 4.0;
    if (rc == EXANET_OK)
        rc = exanet_allreduce(c, g, EXANET_OP_SUM, EXANET_TYPE_F64, in, out, sizeof in, path);
    if (rc != EXANET_OK) {
        fprintf(stderr, "member %d: %s: %s\n", j->index, exanet_strerror(rc), exanet_last_error());
        j->failed = 1;
    } else {
        for (int k = 0; k < N; k++) {
            double want = count * (count + 1) / 2.0 + count * (k / 4.0);
            if (out[k] != want) {
                fprintf(stderr, "member %d: element %d is %g, not %g\n", j->index, k, out[k], want);
                j->failed = 1;
                break;
            }
        }
        printf("member %d: ok, modeled clock %.3f us\n", j->index,
               (double)exanet_clock_ps(eps[j->index]) / 1e6);
    }
    exanet_group_free(g);
    exanet_collectives_close(c);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 3 || argc - 2 > MAX_MEMBERS) {
        fprintf(stderr, "usage: allreduce auto|accel|software NODE [NODE...]\n");
        return 2;
    }
    path = strcmp(argv[1], "accel") == 0      ? EXANET_PATH_ACCELERATOR
           : strcmp(argv[1], "software") == 0 ? EXANET_PATH_SOFTWARE
                                              : EXANET_PATH_AUTO;
    count = argc - 2;
    for (int i = 0; i < count; i++) {
        int rc = exanet_attach(NULL, argv[i + 2], NULL, &eps[i]);
        exanet_info_t info;
        if (rc == EXANET_OK) rc = exanet_info(eps[i], &info);
        if (rc != EXANET_OK) {
            fprintf(stderr, "attach %s: %s\n", argv[i + 2], exanet_last_error());
            return 1;
        }
        members[i].node = info.node_id;
        members[i].rank = info.rank;
    }
    pthread_t t[MAX_MEMBERS];
    struct job jobs[MAX_MEMBERS];
    for (int i = 0; i < count; i++) {
        jobs[i] = (struct job){i, 0};
        pthread_create(&t[i], NULL, member, &jobs[i]);
    }
    int failed = 0;
    for (int i = 0; i < count; i++) {
        pthread_join(t[i], NULL);
        failed |= jobs[i].failed;
        exanet_detach(eps[i]);
    }
    printf("%s: %d members %s\n", argv[1], count, failed ? "FAILED" : "agree");
    return failed;
}
