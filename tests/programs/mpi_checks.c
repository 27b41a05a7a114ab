#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int bad;
#define EXPECT(c) do { if (!(c)) { fprintf(stderr, "rank %d line %d: %s\n", rank, __LINE__, #c); bad++; } } while (0)

static char byte(int from, int tag, size_t i) { return (char)(from * 31 + tag * 7 + i * 13); }
static void fill(char *b, size_t n, int from, int tag) { for (size_t i = 0; i < n; i++) b[i] = byte(from, tag, i); }
static int check(const char *b, size_t n, int from, int tag) {
    for (size_t i = 0; i < n; i++) if (b[i] != byte(from, tag, i)) return 0;
    return 1;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;

    long v = rank + 1, sum = 0;
    MPI_Allreduce(&v, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    EXPECT(sum == (long)size * (size + 1) / 2);

    size_t big = 256 * 1024;
    char *out = malloc(big), *in = malloc(big);
    fill(out, big, rank, 1);
    MPI_Sendrecv(out, big, MPI_CHAR, next, 1, in, big, MPI_CHAR, prev, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    EXPECT(check(in, big, prev, 1));

    /* Each side of the eager limit, and long: to rank 0 from everyone, taken from any
     * source with any tag after a probe says what comes. */
    size_t sizes[] = { 0, 32, 33, 100000 };
    if (rank != 0) {
        for (int k = 0; k < 4; k++) {
            fill(out, sizes[k], rank, 10 + k);
            MPI_Send(out, sizes[k], MPI_CHAR, 0, 10 + k, MPI_COMM_WORLD);
        }
    } else {
        int got[64][4] = {{0}};
        for (int m = 0; m < (size - 1) * 4; m++) {
            MPI_Status st;
            if (m % 2) {
                MPI_Probe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &st);
            } else {
                int flag = 0;
                while (!flag) MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &st);
            }
            int n, k = st.MPI_TAG - 10;
            MPI_Get_count(&st, MPI_CHAR, &n);
            EXPECT(k >= 0 && k < 4 && (size_t)n == sizes[k]);
            MPI_Status rs;
            MPI_Recv(in, big, MPI_CHAR, st.MPI_SOURCE, st.MPI_TAG, MPI_COMM_WORLD, &rs);
            MPI_Get_count(&rs, MPI_CHAR, &n);
            EXPECT(rs.MPI_SOURCE == st.MPI_SOURCE && (size_t)n == sizes[k]);
            EXPECT(check(in, n, rs.MPI_SOURCE, rs.MPI_TAG));
            got[rs.MPI_SOURCE][k]++;
        }
        for (int r = 1; r < size; r++) for (int k = 0; k < 4; k++) EXPECT(got[r][k] == 1);
    }
    /* A sender's MPI_Send may end before rank 0 took the message (the provider staged
     * it): without this, rank 0's any-tag probes could meet the next part's messages. */
    MPI_Barrier(MPI_COMM_WORLD);

    /* Nonblocking: receives posted for three tags from the previous rank, sends in the
     * reverse order, completed as they end. */
    char *rb[3];
    MPI_Request rq[6];
    size_t len[3] = { 8, 40, 5000 };
    for (int k = 0; k < 3; k++) {
        rb[k] = calloc(1, len[k]);
        MPI_Irecv(rb[k], len[k], MPI_CHAR, prev, 20 + k, MPI_COMM_WORLD, &rq[k]);
    }
    char *sb[3];
    for (int k = 2; k >= 0; k--) {
        sb[k] = malloc(len[k]);
        fill(sb[k], len[k], rank, 20 + k);
        MPI_Isend(sb[k], len[k], MPI_CHAR, next, 20 + k, MPI_COMM_WORLD, &rq[3 + k]);
    }
    for (int done = 0; done < 6; done++) {
        int i;
        MPI_Waitany(6, rq, &i, MPI_STATUS_IGNORE);
        if (i < 3) EXPECT(check(rb[i], len[i], prev, 20 + i));
    }

    int total = 0;
    MPI_Reduce(&bad, &total, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0 && total == 0) printf("MPI checks: ok on %d ranks\n", size);
    MPI_Finalize();
    return total != 0;
}
