#!/usr/bin/env bash
# A whole node, side by side with MPI and gloo: what a machine with many cores gives at 8 and 16
# ranks. Run it on the node itself, from the repository root, with pycoll importable (installed, or
# built in place and on PYTHONPATH); it writes its tables, JSON and pictures under OUT.
#
#     bash benchmarks/node.sh OUT [RANKS] [STEPS]
#
# RANKS: the rank counts of the perf table (default 8,16); STEPS: which parts to run, any of
# info,perf,forms,bound,torch,ddp (default all of them). Every launch has a wall-clock limit.
# Environment: SIZES, the perf table's sizes (default 8,4K,16K,64K,256K,1M,4M); BIND: how ranks are
# placed (--bind of pycoll perf/run: auto, the default, pins each rank to a core of its own where
# they fit; core; none); PYCOLL_MPIEXEC, the mpiexec to use.
set -u
out=${1:?usage: node.sh OUT [RANKS] [STEPS]}
ranks=${2:-8,16}
steps=${3:-info,perf,forms,bound,torch,ddp}
top=${ranks##*,}  # the largest rank count
sizes=${SIZES:-8,4K,16K,64K,256K,1M,4M}
bind=${BIND:-auto}
mkdir -p "$out"
py=${PYTHON:-python3}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # one thread per rank: ranks fill the cores
has() { [[ ",$steps," == *",$1,"* ]]; }
say() { echo "== $(date +%T) $*"; }

say "machine: $(nproc --all) cores, $(uname -r); /dev/shm: $(df -h /dev/shm | awk 'NR==2 {print $2}')"
lscpu | grep -E 'Model name|NUMA node\(s\)|L3' || true
if has info; then
    say "pycoll info -n $top"
    timeout 120 "$py" -m pycoll info -n "$top" > "$out/info.txt" 2>&1
    cat "$out/info.txt"
fi
if has perf; then
    say "pycoll perf all -n $ranks --compare mpi --sizes $sizes --bind $bind"
    timeout 420 "$py" -m pycoll perf all -n "$ranks" --compare mpi --sizes "$sizes" --bind "$bind" \
        --timeout 400 --json "$out/perf.json" --plot "$out/scaling.png" > "$out/perf.txt" 2>&1
    echo "rc $?"
    tail -45 "$out/perf.txt"  # the table of vs_mpi by collective, size and rank count
fi
if has forms; then
    # the large-message forms side by side: the segment's allreduce and the single copy
    for alg in shm cma; do
        say "pycoll perf allreduce -n $ranks --algorithm $alg --compare mpi (256 KiB to 128 MiB)"
        timeout 200 "$py" -m pycoll perf allreduce -n "$ranks" --algorithm "$alg" --compare mpi \
            --min-bytes 256K --max-bytes 128M --timeout 190 > "$out/allreduce_$alg.txt" 2>&1
        echo "rc $?"
        grep -v '^pycoll perf:' "$out/allreduce_$alg.txt"
    done
    say "pycoll perf scatterv -n $ranks --algorithm shm --compare mpi (256 KiB to 4 MiB; perf: the default)"
    timeout 100 "$py" -m pycoll perf scatterv -n "$ranks" --algorithm shm --compare mpi \
        --min-bytes 256K --max-bytes 4M --timeout 90 > "$out/scatterv_shm.txt" 2>&1
    echo "rc $?"
    grep -v '^pycoll perf:' "$out/scatterv_shm.txt"
fi
if has bound; then
    for n in ${ranks//,/ }; do
        say "copy bound, allreduce 16-128 MiB at $n ranks"
        timeout 180 "$py" -m pycoll run -n "$n" --bind "$bind" --timeout 170 -- "$py" benchmarks/copy_bound.py \
            --sizes 16M,64M,128M --iters 5 2>&1 | tee "$out/bound_$n.txt"
    done
fi
if has torch; then
    say "torch all_reduce, pycoll vs gloo, $top ranks"
    timeout 240 "$py" -m pycoll run -n "$top" --bind "$bind" --timeout 230 -- "$py" benchmarks/torch_allreduce.py \
        --sizes 4,4K,64K,1M,4M,16M,64M 2>&1 | tee "$out/torch.txt"
fi
if has ddp; then
    say "DDP step, pycoll vs gloo, 8 ranks"
    timeout 240 "$py" -m pycoll run -n 8 --bind "$bind" --timeout 230 -- "$py" benchmarks/torch_ddp.py 2>&1 \
        | tee "$out/ddp.txt"
fi
say "done"
