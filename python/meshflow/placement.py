"""Placements: how a tensor lies along one mesh dim (DTensor's Shard, Replicate, Partial)."""


class Placement:
    """Base of Shard, Replicate and Partial; ``str`` gives meshflow's text form."""

    def is_shard(self, dim=None):
        return False

    def is_replicate(self):
        return False

    def is_partial(self):
        return False

    def __eq__(self, other):
        return isinstance(other, Placement) and str(self) == str(other)

    def __hash__(self):
        return hash(str(self))


class Shard(Placement):
    """Split tensor dim ``dim`` across the mesh dim (the chunk rule for uneven sizes)."""

    def __init__(self, dim):
        if not isinstance(dim, int):
            raise TypeError(f"Shard dim must be an int, not {type(dim).__name__}")
        self.dim = dim

    def is_shard(self, dim=None):
        return dim is None or dim == self.dim

    def __str__(self):
        return f"S({self.dim})"

    def __repr__(self):
        return f"Shard(dim={self.dim})"


class Replicate(Placement):
    """Every device of the mesh dim holds the same values."""

    def is_replicate(self):
        return True

    def __str__(self):
        return "R"

    def __repr__(self):
        return "Replicate()"


class Partial(Placement):
    """Each device holds a term; the value is their reduction (sum, avg, max or min)."""

    def __init__(self, reduce_op="sum"):
        self.reduce_op = reduce_op

    def is_partial(self):
        return True

    def __str__(self):
        return f"P({self.reduce_op})"

    def __repr__(self):
        return f"Partial({self.reduce_op!r})"


def to_text(placements):
    """Returns "S(0),R" for a sequence of placements."""
    if isinstance(placements, Placement):
        placements = [placements]
    out = []
    for p in placements:
        if not isinstance(p, Placement):
            raise TypeError(f"{p!r} is not a Shard, Replicate or Partial")
        out.append(str(p))
    return ",".join(out)


def from_text(text):
    """Returns the placements written as "S(0),R,P(sum)"."""
    out = []
    for item in text.split(","):
        item = item.strip()
        if item == "R":
            out.append(Replicate())
        elif item.startswith("S("):
            out.append(Shard(int(item[2:-1])))
        elif item.startswith("P("):
            out.append(Partial(item[2:-1]))
        elif item:
            raise ValueError(f"placement {item!r}")
    return tuple(out)
