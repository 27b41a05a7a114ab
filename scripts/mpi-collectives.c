/* MPI collectives timed by the program itself with MPI_Wtime, as osu_allreduce and
 * osu_bcast do: under `exactl mpirun --modeled` MPI_Wtime is the rank's modeled clock.
 * Usage: mpi-collectives allreduce|bcast BYTES ITERATIONS WARMUP
 * Prints one line on rank 0: the operation, the size, and min / mean / max over the
 * iterations of the slowest rank's time (each iteration starts after a barrier). The
 * allreduce sums doubles (bytes / 8 of them; 4 ints below 8 B) and checks the result. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc != 5) {
        if (rank == 0) fprintf(stderr, "usage: %s allreduce|bcast BYTES ITERATIONS WARMUP\n", argv[0]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int bcast = !strcmp(argv[1], "bcast");
    int bytes = atoi(argv[2]), iters = atoi(argv[3]), warmup = atoi(argv[4]);
    int dbl = bytes >= 8;
    int count = dbl ? bytes / 8 : (bytes + 3) / 4;
    if (bcast) count = bytes;
    void *in = calloc(count ? count : 1, 8), *out = calloc(count ? count : 1, 8);
    double lo = 1e30, hi = 0, sum = 0;
    int bad = 0;
    for (int i = 0; i < warmup + iters; i++) {
        for (int k = 0; k < count; k++) {
            if (bcast) ((char *)in)[k] = rank == 0 ? (char)(i + k) : 0;
            else if (dbl) ((double *)in)[k] = rank + i + k;
            else ((int *)in)[k] = rank + i + k;
        }
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        if (bcast) MPI_Bcast(in, count, MPI_CHAR, 0, MPI_COMM_WORLD);
        else MPI_Allreduce(in, out, count, dbl ? MPI_DOUBLE : MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        double t = MPI_Wtime() - t0, slowest;
        MPI_Reduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        for (int k = 0; k < count; k++) {
            long want = (long)size * (size - 1) / 2 + (long)size * (i + k);
            if (bcast) bad += ((char *)in)[k] != (char)(i + k);
            else if (dbl) bad += ((double *)out)[k] != (double)want;
            else bad += ((int *)out)[k] != (int)want;
        }
        if (i >= warmup && rank == 0) {
            lo = slowest < lo ? slowest : lo;
            hi = slowest > hi ? slowest : hi;
            sum += slowest;
        }
    }
    int total = 0;
    MPI_Reduce(&bad, &total, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0)
        printf("%s %d B on %d ranks: %.3f / %.3f / %.3f us (min / mean / max), %s\n", argv[1], bytes,
               size, lo * 1e6, sum / iters * 1e6, hi * 1e6, total ? "WRONG RESULTS" : "results checked");
    MPI_Finalize();
    return total != 0;
}
