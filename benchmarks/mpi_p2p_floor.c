/* Recursive-doubling allreduce of 8 B through MPI point to point, from C: what a native program
 * executor calling MPI itself would spend per call, against MPI_Allreduce, with no Python at all.
 * Build and run with the mpich wheel's compiler and launcher (power-of-two rank counts):
 *
 *     mpicc -O2 -o /tmp/mpi_p2p_floor benchmarks/mpi_p2p_floor.c
 *     mpiexec -bind-to core -n 2 /tmp/mpi_p2p_floor
 *
 * and compare with PYCOLL_TLS=mpi / ucx pycoll perf allreduce -n 2 --algorithm rd --sizes 8
 * (docs/guide/programs.md: why the MPI transport keeps its Python path). */
#include <mpi.h>
#include <stdio.h>
int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size; MPI_Comm_rank(MPI_COMM_WORLD, &rank); MPI_Comm_size(MPI_COMM_WORLD, &size);
    double x[1] = {1.0}, t[1], y[1];
    int iters = 200000;
    for (int rep = 0; rep < 3; rep++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int i = 0; i < iters; i++) {
            double cur = x[0];
            for (int d = 1; d < size; d <<= 1) {
                int peer = rank ^ d;
                MPI_Request r[2];
                MPI_Irecv(t, 1, MPI_DOUBLE, peer, d, MPI_COMM_WORLD, &r[0]);
                MPI_Isend(&cur, 1, MPI_DOUBLE, peer, d, MPI_COMM_WORLD, &r[1]);
                MPI_Waitall(2, r, MPI_STATUSES_IGNORE);
                cur += t[0];
            }
            y[0] = cur;
        }
        double p2p = (MPI_Wtime() - t0) / iters * 1e6;
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = MPI_Wtime();
        for (int i = 0; i < iters; i++) MPI_Allreduce(x, y, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        double coll = (MPI_Wtime() - t0) / iters * 1e6;
        if (rank == 0) printf("8 B: rd over Isend/Irecv from C %.2f us, MPI_Allreduce %.2f us\n", p2p, coll);
    }
    MPI_Finalize();
    return 0;
}
