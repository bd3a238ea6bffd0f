"""Low-rank members and LoRA adapters inside the native decoder, with per-row factors.

Member k perturbs a weight W by ``sign_k * sigma * A_k B_k^T / sqrt(R)`` (``trainers/es/noise/lowrank.py``,
whose ``Population`` draws the factors, so every engine sees the same members; in a bf16 model
the factors' bf16 copies, the term added in the output's own rounding). The decoder asks
``add(layer, group, x, outs)`` after each group of products that share an input x (q/k/v,
o, gate/up, down) and every live row gets its own member's correction

    out_j += (x B_group)[:, cols_j] A_j^T        (sign and sigma / sqrt(R) folded into A_j)

The factors of a group's projections are concatenated, so ``x B_group`` is one batched product
for the whole group. ``select`` names each live row's member. Rows leave the batch as they finish,
so a member's rows are neither contiguous nor equal in number; two layouts serve that:

- **by member** (``_ByMember``, the decode loop's, when some member has several live rows and the
  rank is above ``ELEMENTWISE_MAX_RANK``, whose rank-1 sums stay per row): the rows are gathered
  into a padded ``(members, rows per member)`` block, the products are ``bmm`` over members, and
  each member's factors are read once per product however many rows it has. The engine puts a
  wave's rows member by member, so until a row leaves, the block is the rows themselves (viewed,
  and the second product added in place with ``baddbmm_``: no copies);
- **per row** (one row per member, and the fixed-shape path, whose shapes cannot depend on how
  the rows fall): each row's factors are gathered and the products are batched over rows.

LoRA adapters are the same computation (``trainers/es/noise/adapters.py``): an adapter adds
``scale (x A^T) B^T``, so ``AdapterPopulation`` holds ``A^T`` where ``Population`` holds B and
``scale B^T`` where it holds ``A^T``; a plain PEFT model is a population of one member, its own
adapter, on every row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainers.es.noise.lowrank import ELEMENTWISE_MAX_RANK, Population

#: The most memory the live rows' gathered factors may hold between two ``select`` calls (``keep``):
#: gathering them at every product, per decode step, copies a population's factors per row per step
#: (ES on rank-8 adapters: 0.76x plain generation before this, 0.81x after, in two runs on one CPU).
KEEP_BYTES = 1 << 29

#: The module names the native decoder applies adapters on (``GROUPS``' leaves).
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

#: The projections of a decoder layer, by the input they share.
GROUPS = {"qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), "o": ("self_attn.o_proj",),
          "gate_up": ("mlp.gate_proj", "mlp.up_proj"), "down": ("mlp.down_proj",)}


@dataclass
class _ByMember:
    """The live rows laid out by member: ``padded (members * per,)`` the row at each place of the
    block (places beyond a member's rows repeat row 0, computed and never read), ``place (rows,)``
    each row's place in it, ``present (members,)`` the members with live rows (None: all, in order);
    ``in_place``: the rows already are that block (every member present with ``per`` rows, member by
    member: a wave's rows before any leaves), so inputs and outputs are viewed, not copied."""
    present: torch.Tensor | None
    padded: torch.Tensor
    place: torch.Tensor
    per: int
    in_place: bool = False

    @staticmethod
    def of(members: torch.Tensor, population: int) -> _ByMember | None:
        """The layout of ``members`` (each live row's member), or None when no member has two rows
        (then per-row products read no more factors than these would)."""
        present, inverse, counts = torch.unique(members, return_inverse=True, return_counts=True)
        per = int(counts.max())
        if per < 2:
            return None
        order = torch.argsort(inverse, stable=True)  # the rows, member by member
        first = torch.cumsum(counts, 0) - counts  # each member's first place among the sorted rows
        sorted_member = inverse[order]
        place = torch.empty_like(order)
        rows = torch.arange(len(order), device=order.device)
        place[order] = sorted_member * per + rows - first[sorted_member]
        padded = torch.zeros(len(present) * per, dtype=torch.long, device=order.device)
        padded[place] = rows
        everyone = len(present) == population  # present is then 0..population-1: the factors as held
        in_place = everyone and len(place) == len(padded) and bool((place == rows).all())
        return _ByMember(None if everyone else present, padded, place, per, in_place)


@dataclass
class _Group:
    Bt: torch.Tensor  # (members, g * R, d_in): the perturbed projections' B^T stacked
    At: list[torch.Tensor | None]  # per projection of the group: (members, R, d_out), or None if not perturbed
    rank: int


class RowNoise:
    """The factors of a population (``lowrank.Population`` of ``LowRankMembers``, or an
    ``adapters.AdapterPopulation``) on a decoder's layers, ready to be added per row."""

    def __init__(self, pop: Population, decoder_layers, dtype: torch.dtype):
        rank = pop.B[0].shape[-1]
        B, At = pop.in_dtype(dtype)  # the dtype the decoder computes in
        by_module = {id(layer.module): i for i, layer in enumerate(pop.layers)}
        self.groups: dict[tuple[int, str], _Group] = {}
        for li, block in enumerate(decoder_layers):
            for key, names in GROUPS.items():
                index = [by_module.get(id(block.get_submodule(name))) for name in names]
                if all(i is None for i in index):
                    continue
                Bt = torch.cat([B[i].transpose(1, 2) for i in index if i is not None], dim=1).contiguous()
                self.groups[li, key] = _Group(Bt, [None if i is None else At[i] for i in index], rank)
        if sum(g.Bt.shape[1] for g in self.groups.values()) != rank * len(pop.layers):  # some layer not found
            raise ValueError("--engine native: the low-rank or adapter layers are not all q/k/v/o/gate/up/down "
                             "projections of the decoder's layers; use --engine hf")
        self.members = torch.zeros(0, dtype=torch.long)
        self.kept: dict[tuple[int, str], tuple[torch.Tensor, list[torch.Tensor | None]]] | None = None
        self.by_member: _ByMember | None = None
        self.population = next(iter(self.groups.values())).Bt.shape[0] if self.groups else 0
        self.row_bytes = sum((g.Bt[0].numel() + sum(a[0].numel() for a in g.At if a is not None)) * g.Bt.element_size()
                             for g in self.groups.values())  # one row's factors over every layer

    def take(self, other: RowNoise) -> bool:
        """Copy ``other``'s factors into this one's tensors, in place: a captured CUDA graph reads
        them where they are (the fixed-shape path keeps one ``RowNoise`` across calls). False, and
        nothing copied, when the two differ in layout (members, rank, layers, dtype)."""
        def layout(g: _Group):
            return g.rank, g.Bt.shape, g.Bt.dtype, [None if a is None else (a.shape, a.dtype) for a in g.At]

        if self.groups.keys() != other.groups.keys() or any(layout(g) != layout(other.groups[k])
                                                            for k, g in self.groups.items()):
            return False
        for key, g in self.groups.items():
            g.Bt.copy_(other.groups[key].Bt)
            for a, b in zip(g.At, other.groups[key].At):
                if a is not None:
                    a.copy_(b)
        return True

    def select(self, members: torch.Tensor, keep: bool = False) -> None:
        """The live rows are now of members ``members`` (one index per row, in slot order).
        ``keep`` (the decode loop's, not a captured CUDA graph's): lay the rows out by member when
        some member has several; else gather each live row's factors once and keep them until the
        next ``select`` (the decode steps between two changes of the live rows reuse them) when they
        fit in ``KEEP_BYTES``. Without ``keep``, ``add`` gathers each row's factors at every product."""
        self.members = members
        multi = self.population > 1 and next(iter(self.groups.values())).rank > ELEMENTWISE_MAX_RANK
        self.by_member = _ByMember.of(members, self.population) if keep and multi and len(members) else None
        self.kept = {} if keep and (self.by_member is not None or len(members) * self.row_bytes <= KEEP_BYTES) \
            else None

    def add(self, layer: int, group: str, x: torch.Tensor, outs: tuple[torch.Tensor, ...]) -> None:
        """Add each row's member correction to ``outs (rows, T, d_out)`` in place; their input is
        ``x (rows, T, d_in)``. The live rows' factors are gathered here, per product: holding them
        per row for a whole call would cost (rows / members) times the population's factors."""
        g = self.groups.get((layer, group))
        if g is None:
            return
        if g.Bt.shape[0] == 1:  # one member (a PEFT model's own adapter) on every row: plain products
            xb = x.reshape(-1, x.shape[-1]).to(g.Bt.dtype) @ g.Bt[0].T  # (rows * T, g * R)
            col = 0
            for out, a in zip(outs, g.At):
                if a is not None:
                    out.add_((xb[:, col:col + g.rank] @ a[0]).view(out.shape))
                    col += g.rank
            return
        if self.by_member is not None:
            return self._add_by_member((layer, group), g, x, outs)
        Bt, At = self.rows_of((layer, group), g)
        xb = torch.bmm(Bt, x.to(Bt.dtype).transpose(1, 2))  # (rows, g * R, T): this layout was the fastest on CPU
        col, r = 0, g.rank
        for out, a in zip(outs, At):
            if a is None:
                continue
            if r <= ELEMENTWISE_MAX_RANK:  # rank-1 updates: several times faster than bmm with R columns on CPU
                for c in range(r):
                    out.addcmul_(xb[:, col + c, :, None], a[:, c:c + 1])
            else:
                out.baddbmm_(xb[:, col:col + r].transpose(1, 2), a)
            col += r

    def rows_of(self, key: tuple[int, str], g: _Group) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        """The live rows' factors of group ``g``: ``Bt (rows, g * R, d_in)`` and each projection's
        ``A^T (rows, R, d_out)``, gathered now or kept since ``select``."""
        if self.kept is not None and key in self.kept:
            return self.kept[key]
        rows = (g.Bt.index_select(0, self.members), [None if a is None else a.index_select(0, self.members) for a in g.At])
        if self.kept is not None:
            self.kept[key] = rows
        return rows

    def _add_by_member(self, key: tuple[int, str], g: _Group, x: torch.Tensor, outs: tuple[torch.Tensor, ...]) -> None:
        """``add`` with the rows in the ``_ByMember`` block: two ``bmm`` over members per projection,
        each member's factors read once for all of its rows."""
        lay = self.by_member
        if lay.present is None:
            Bt, At = g.Bt, g.At
        elif key in self.kept:
            Bt, At = self.kept[key]
        else:  # some members have finished: their factors stay out of the products
            Bt, At = g.Bt.index_select(0, lay.present), [None if a is None else a.index_select(0, lay.present)
                                                          for a in g.At]
            self.kept[key] = Bt, At
        members, T = Bt.shape[0], x.shape[1]
        x = x.to(Bt.dtype)
        block = x.reshape(members, lay.per * T, -1) if lay.in_place else \
            x.index_select(0, lay.padded).view(members, lay.per * T, -1)
        xb = torch.bmm(block, Bt.transpose(1, 2))  # (members, per * T, g * R)
        col = 0
        for out, a in zip(outs, At):
            if a is None:
                continue
            if lay.in_place and out.is_contiguous() and out.dtype == a.dtype:
                out.view(members, lay.per * T, -1).baddbmm_(xb[:, :, col:col + g.rank], a)
            else:
                delta = torch.bmm(xb[:, :, col:col + g.rank], a)  # (members, per * T, d_out)
                out.add_(delta.view(-1, T, a.shape[-1]).index_select(0, lay.place).to(out.dtype))
            col += g.rank
