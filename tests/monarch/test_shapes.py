"""Shapes as Monarch has them: ValueMesh.slice and flatten, size(dim) on every mesh, the
actor's own rank, sizes and identity (current_rank, current_size, context, its log lines)."""

from __future__ import annotations

import logging

import pytest

from regent.controller import Session, ValueMesh
from regent.worker import Actor, context, current_rank, current_size, endpoint


class Where(Actor):
    @endpoint
    def rank_text(self) -> str:
        return str(current_rank())

    @endpoint
    def sizes(self) -> dict[str, int]:
        return current_size()

    @endpoint
    def identity(self) -> tuple[str, int, str]:
        ctx = context()
        return ctx.mesh, ctx.rank, str(ctx)

    @endpoint
    def log_line(self, text: str) -> str:
        """A warning logged with `logging`, as a handler of the actor's would format it."""
        lines: list[str] = []
        handler = logging.Handler()
        handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
        logger = logging.getLogger("monarch-shapes")
        logger.addHandler(handler)
        try:
            logger.warning("said %s", text)
        finally:
            logger.removeHandler(handler)
        return lines[0]


@pytest.fixture(scope="module")
def session():
    with Session("monarch-shapes") as s:
        yield s


@pytest.fixture(scope="module")
def procs(session):
    return session.spawn_procs(per_host={"procs": 2})


@pytest.fixture(scope="module")
def where(procs):
    return procs.spawn("where", Where)


def grid() -> ValueMesh:
    return ValueMesh({"hosts": 2, "gpus": 3}, [f"h{h}g{g}" for h in range(2) for g in range(3)])


def test_value_mesh_slice_drops_dims_picked_by_index_and_keeps_dims_picked_by_range():
    vm = grid()
    by_host = vm.slice(hosts=1)
    assert by_host.dims == {"gpus": 3} and by_host.values() == ["h1g0", "h1g1", "h1g2"]
    ranged = vm.slice(gpus=slice(1, 3))
    assert ranged.dims == {"hosts": 2, "gpus": 2}
    assert ranged.values() == ["h0g1", "h0g2", "h1g1", "h1g2"]
    assert vm.slice(hosts=0, gpus=2).item() == "h0g2"
    with pytest.raises(IndexError):
        vm.slice(gpus=3)
    with pytest.raises(KeyError, match="no dimension 'procs'"):
        vm.slice(procs=0)


def test_value_mesh_flatten_puts_every_value_on_one_named_dim_in_row_major_order():
    flat = grid().flatten("r")
    assert flat.dims == {"r": 6}
    assert flat.slice(r=4).item() == "h1g1"
    assert [p.rank for p, _ in flat.items()] == list(range(6))


def test_value_mesh_size_counts_values_one_dim_or_several():
    vm = grid()
    assert (vm.size(), vm.size("gpus"), vm.size(["hosts", "gpus"])) == (6, 3, 6)
    with pytest.raises(KeyError):
        vm.size("procs")


def test_proc_actor_and_host_meshes_have_size(session, procs, where):
    assert (procs.size(), procs.size("procs"), procs.size("hosts")) == (2, 2, 1)
    assert (where.size(), where.slice(procs=1).size()) == (2, 1)
    assert session.this_host().size() == session.this_host().size("hosts") == 1


def test_current_size_inside_an_actor_gives_each_dim_of_its_mesh(where):
    assert where.sizes.call().get().values() == [{"hosts": 1, "procs": 2}] * 2


def test_current_rank_shows_each_coordinate_out_of_its_size_as_monarch_does(where):
    assert where.rank_text.call().get().values() == ["{'hosts': 0/1, 'procs': 0/2}",
                                                     "{'hosts': 0/1, 'procs': 1/2}"]


def test_a_points_text_in_a_value_mesh_shows_the_sizes_too(where):
    points = [str(p) for p, _ in where.rank_text.call().get().items()]
    assert points == ["{'hosts': 0/1, 'procs': 0/2}", "{'hosts': 0/1, 'procs': 1/2}"]


def test_context_names_the_actor_mesh_and_rank(where):
    assert where.slice(procs=1).identity.call_one().get() == ("where", 1, "where{'hosts': 0/1, 'procs': 1/2}")


def test_an_actors_log_records_start_with_its_identity(where):
    assert where.slice(procs=0).log_line.call_one("100%").get() == (
        "[actor=where{'hosts': 0/1, 'procs': 0/2}] said 100%")
