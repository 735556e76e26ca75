"""The shape of a mesh: named dims, the coordinates of a member (`Point`), slicing and sizes.

Shared by the controller (mesh views, value meshes) and by actors (`current_rank()`), so it
lives below both. Pure functions over dicts and tuples: no sessions, no sockets.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")


class Point(Mapping[str, int]):
    """Coordinates of one member of a mesh, with its rank in that mesh and the mesh's sizes.

    Shown as Monarch shows it, each coordinate out of its dim's size: {'hosts': 0/1, 'procs': 2/4}."""

    __slots__ = ("rank", "_coords", "_sizes")

    def __init__(self, rank: int, coords: dict[str, int], sizes: Mapping[str, int] | None = None):
        self.rank = rank
        self._coords = coords
        self._sizes = dict(sizes) if sizes is not None else None

    def __getitem__(self, key: str) -> int:
        return self._coords[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._coords)

    def __len__(self) -> int:
        return len(self._coords)

    @property
    def extent(self) -> dict[str, int]:
        """The size of each dim of the mesh this point is in."""
        if self._sizes is None:
            raise ValueError(f"the sizes of the mesh of {self!r} are not known")
        return dict(self._sizes)

    def size(self, dim: str) -> int:
        """The size of dim `dim` of the mesh this point is in."""
        return self.extent[dim]

    def __repr__(self) -> str:
        sizes = self._sizes or {}
        parts = (f"{name!r}: {c}/{sizes[name]}" if name in sizes else f"{name!r}: {c}"
                 for name, c in self._coords.items())
        return "{" + ", ".join(parts) + "}"

    def __hash__(self) -> int:
        return hash((self.rank, tuple(self._coords.items())))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Point) and other.rank == self.rank and other._coords == self._coords


def point_of(dims: Mapping[str, int], rank: int) -> Point:
    """The member at row-major `rank` of a mesh shaped `dims`."""
    coords: dict[str, int] = {}
    rest = rank
    for name, size in reversed(list(dims.items())):
        coords[name] = rest % size
        rest //= size
    return Point(rank, dict(reversed(list(coords.items()))), dims)


def select(dims: Mapping[str, int], members: Sequence[int], sel: Mapping[str, int | slice]
           ) -> tuple[dict[str, int], list[int]]:
    """Slice a mesh shaped `dims` whose members (in row-major order) are `members`: an int
    picks one index of a dim and drops the dim, a slice keeps the dim, restricted. Returns the
    new dims and the members they cover, in row-major order."""
    for name in sel:
        if name not in dims:
            raise KeyError(f"no dimension {name!r} to slice; this mesh has {list(dims)}")
    picks: dict[str, list[int]] = {}
    for name, size in dims.items():
        s = sel.get(name)
        if s is None:
            picks[name] = list(range(size))
        elif isinstance(s, slice):
            picks[name] = list(range(size))[s]
        elif isinstance(s, int) and not isinstance(s, bool):
            if not -size <= s < size:
                raise IndexError(f"{name}={s} outside 0..{size - 1}")
            picks[name] = [s % size]
        else:
            raise TypeError(f"slice {name}= takes an int or a slice, not {type(s).__name__}")
    if any(not p for p in picks.values()):
        raise IndexError(f"slice {dict(sel)} selects no members")
    new_dims = {n: len(p) for n, p in picks.items() if not isinstance(sel.get(n), int)}
    chosen = {n: set(p) for n, p in picks.items()}
    picked = [m for i, m in enumerate(members)
              if all(c in chosen[n] for n, c in point_of(dims, i).items())]
    return new_dims, picked


def size_of(dims: Mapping[str, int], dim: str | Sequence[str] | None = None) -> int:
    """Monarch's `size(dim)`: the number of members of a mesh shaped `dims` (dim=None), the
    size of one dim, or the product of the sizes of several."""
    if dim is None:
        dim = list(dims)
    if isinstance(dim, str):
        if dim not in dims:
            raise KeyError(f"no dimension {dim!r}; this mesh has {list(dims)}")
        return dims[dim]
    n = 1
    for d in dim:
        n *= size_of(dims, d)
    return n


class ValueMesh(Generic[T]):
    """One value per point of the mesh a call was made on."""

    def __init__(self, dims: Mapping[str, int], values: Sequence[T]):
        self._dims = dict(dims)
        self._values = list(values)

    @property
    def dims(self) -> dict[str, int]:
        return dict(self._dims)

    def __len__(self) -> int:
        return len(self._values)

    def values(self) -> list[T]:
        return list(self._values)

    def items(self) -> Iterator[tuple[Point, T]]:
        for rank, value in enumerate(self._values):
            yield point_of(self._dims, rank), value

    def item(self, **coords: int) -> T:
        """The value at these coordinates (every dim must be named)."""
        if set(coords) != set(self._dims):
            raise KeyError(f"item() needs every dimension {list(self._dims)}, got {list(coords)}")
        rank = 0
        for name, size in self._dims.items():
            c = coords[name]
            if not 0 <= c < size:
                raise IndexError(f"{name}={c} outside 0..{size - 1}")
            rank = rank * size + c
        return self._values[rank]

    def slice(self, **sel: int | slice) -> ValueMesh[T]:
        """Some of the values, as a mesh's `slice`: dim=i keeps index i and drops the dim,
        dim=slice(a, b) keeps the dim, restricted (`vm.slice(procs=0).item()`)."""
        dims, values = select(self._dims, self._values, sel)
        return ValueMesh(dims, values)

    def flatten(self, name: str) -> ValueMesh[T]:
        """The same values in row-major order along one dim called `name`."""
        return ValueMesh({name: len(self._values)}, self._values)

    def size(self, dim: str | Sequence[str] | None = None) -> int:
        """How many values (dim=None), or the size of a dim (or the product of several)."""
        return size_of(self._dims, dim)

    def __iter__(self) -> Iterator[tuple[Point, T]]:
        return self.items()

    def __repr__(self) -> str:
        return f"ValueMesh({self._dims}, {self._values!r})"
