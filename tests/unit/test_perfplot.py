"""pycoll perf's pictures from rows as ``--json`` writes them (no ranks started)."""

import pytest

from pycoll import perfplot


def test_paths_one_or_per_collective():
    assert perfplot.paths_for("a.png", ["allreduce"]) == {"allreduce": "a.png"}
    want = {"bcast": "d/a_bcast.png", "gather": "d/a_gather.png"}
    assert perfplot.paths_for("d/a.png", ["bcast", "gather"]) == want


def test_plot_writes_time_and_busbw_of_pycoll_and_mpi(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install pycoll[plot])")
    meta = dict(coll="allreduce", ranks=2, dtype="float32", algorithm="auto", transport="shm+mpi",
                machine="vm", cpus=2, bus_factor=1.0, factor="2(n-1)/n", mpi="Allreduce")
    rows = [dict(coll="allreduce", bytes=b, avg_us=5 + b / 1e3, busbw=b / (5 + b / 1e3) / 1e3,
                 mpi_us=2 + b / 8e2, mpi_algbw=b / (2 + b / 8e2) / 1e3) for b in (8, 64, 512, 4096)]
    barrier = dict(meta, coll="barrier", bus_factor=None, factor="-", mpi="Barrier")
    written = perfplot.plot(rows + [dict(coll="barrier", bytes=0, avg_us=4.0, mpi_us=2.0)], [meta, barrier],
                            str(tmp_path / "p.png"))
    assert written == [str(tmp_path / "p_allreduce.png"), str(tmp_path / "p_barrier.png")]
    sizes = [(tmp_path / f"p_{c}.png").stat().st_size for c in ("allreduce", "barrier")]
    assert sizes[0] > sizes[1] > 5_000  # two panels against one


def test_plot_one_line_per_algorithm(tmp_path):
    """``--algorithm all``: rows of several algorithms of one collective make one picture with a
    line per algorithm (and MPI once)."""
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install pycoll[plot])")
    import matplotlib.pyplot as plt

    meta = dict(coll="bcast", ranks=2, dtype="float32", algorithm="auto", transport="shm+mpi",
                machine="vm", cpus=2, bus_factor=1.0, factor="1", mpi="Bcast")
    rows, metas = [], []
    for k, name in enumerate(("auto", "knomial", "shm")):
        metas.append(dict(meta, algorithm=name))
        rows += [dict(coll="bcast", algorithm=name, bytes=b, avg_us=k + 5 + b / 1e3, busbw=1.0, mpi_us=3.0,
                      mpi_algbw=1.0) for b in (8, 64, 512)]
    drawn = {}
    real_savefig = plt.Figure.savefig

    def savefig(fig, *args, **kw):
        drawn["labels"] = [line.get_label() for line in fig.axes[0].get_lines()]
        drawn["title"] = fig._suptitle.get_text()
        return real_savefig(fig, *args, **kw)

    plt.Figure.savefig = savefig
    try:
        written = perfplot.plot(rows, metas, str(tmp_path / "b.png"))
    finally:
        plt.Figure.savefig = real_savefig
    assert written == [str(tmp_path / "b.png")]
    assert drawn["labels"] == ["pycoll auto", "pycoll knomial", "pycoll shm", "MPI Bcast"]
    assert "algorithm all" in drawn["title"]
