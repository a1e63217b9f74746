/* One MPI_Allreduce of argv[1] bytes of float32 on every rank; rank 0 prints the slowest rank's
 * time: run under SimGrid's SMPI by benchmarks/simgrid_crosscheck.py. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank; MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  long count = atol(argv[1]) / 4;
  float *a = calloc(count, 4), *b = calloc(count, 4);
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = MPI_Wtime();
  MPI_Allreduce(a, b, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  double t = MPI_Wtime() - t0, tmax;
  MPI_Reduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  if (rank == 0) printf("TIME_US %.3f\n", tmax * 1e6);
  free(a); free(b);
  MPI_Finalize();
  return 0;
}
