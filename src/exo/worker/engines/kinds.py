"""The weight kinds the compiled kernels run: one record per kind, one table of them.

A kind is a GGUF block type as the file holds it (`ggml`), run by the C kernels under its
`kernel` id (`csrc/exo_kernels.h`'s enum; `csrc/kinds.c` holds the C side's row for it: its
strategies, thresholds and entry points per instruction set). A kind with a repacked layout
(`grouped`: its rows re-laid in groups of 8 by `csrc/repack.c`, read by the grouped kernels) has
a second kernel id for that layout. `tests/test_engine_kind_table.py` checks this table against
the C enum and table. Adding a kind: one row here, one in `csrc/kinds.c` (and its enum value).
"""

from dataclasses import dataclass

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType


@dataclass(frozen=True)
class Kind:
    name: str  # the GGUF type's name; the C names are KIND_<name> and KIND_<name>_G8
    ggml: GGMLQuantizationType
    kernel: int  # KIND_<name>
    grouped: int | None  # KIND_<name>_G8: its rows repacked in groups of 8 rows, if it has one
    act8: bool = False  # has 8-bit-activation dots (kinds.c's act8 = ACT_X8), its groups too
    # issue 22 q5g: its groups pay at 16-bit activations too (else only a layer built at 8 bits
    # takes them: Q5_1's and Q5_K's 16-bit groups, the tile, are slower than the rows at decode)
    groups16: bool = True

    @property
    def block_values(self) -> int:
        return GGML_QUANT_SIZES[self.ggml][0]

    @property
    def block_bytes(self) -> int:
        return GGML_QUANT_SIZES[self.ggml][1]

    def grouped_at(self, bits: int) -> int | None:
        """The groups a layer built at `bits`-bit activations re-lays its rows in, if any."""
        return self.grouped if self.groups16 or bits == 8 else None

    def row_bytes(self, k: int) -> int:
        return k // self.block_values * self.block_bytes


_T = GGMLQuantizationType
KINDS: tuple[Kind, ...] = (
    Kind("Q4_1", _T.Q4_1, 4, 204, act8=True),
    Kind("Q4_0", _T.Q4_0, 40, 240, act8=True),
    Kind("Q8_0", _T.Q8_0, 8, 208, act8=True),
    Kind("Q5_0", _T.Q5_0, 50, 250, act8=True),  # issue 22 q5dots: act8
    # issue 22 q5dots: act8; q5g: groups, at 8-bit activations only
    Kind("Q5_1", _T.Q5_1, 51, 251, act8=True, groups16=False),
    Kind("Q4_K", _T.Q4_K, 104, 304, act8=True),
    Kind("Q5_K", _T.Q5_K, 105, 305, act8=True, groups16=False),  # (as Q5_1)
    Kind("Q6_K", _T.Q6_K, 106, 306, act8=True),
    # MXFP4, IQ4_NL, IQ4_XS (csrc/iq4.h): per-row dots, no repacked layout
    Kind("MXFP4", _T.MXFP4, 70, None),
    Kind("IQ4_NL", _T.IQ4_NL, 60, None),
    Kind("IQ4_XS", _T.IQ4_XS, 110, None),
    # issue 23: Q2_K, Q3_K (csrc/kquant23.h)
    Kind("Q2_K", _T.Q2_K, 102, None),
    Kind("Q3_K", _T.Q3_K, 103, None),
)
GROUP_ROWS = 8  # rows of a repacked group

BY_GGML: dict[GGMLQuantizationType, Kind] = {k.ggml: k for k in KINDS}
BY_NAME: dict[str, Kind] = {k.name: k for k in KINDS}
# every kernel id, the file layouts' and the repacked ones', and whether it is repacked
BY_KERNEL: dict[int, tuple[Kind, bool]] = {
    **{k.kernel: (k, False) for k in KINDS},
    **{k.grouped: (k, True) for k in KINDS if k.grouped is not None},
}


def kind_named(name: str) -> Kind:
    return BY_NAME[name]


def layout_name(kernel: int) -> str:
    """A kernel id's name for the load log ("Q4_1", "Q4_1 (8-row groups)")."""
    kind, grouped = BY_KERNEL[kernel]
    return f"{kind.name} (8-row groups)" if grouped else kind.name
