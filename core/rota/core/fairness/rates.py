"""GPU-type rates: how much service one GPU-second of each GPU type counts for (pure).

The ledger charges a lease its raw GPU-seconds and its weighted GPU-seconds, raw times the
rate of each held GPU's type; fairness (U in docs/design.md §4) reads the weighted ones, so an
H100-hour counts as more service than a V100-hour. Rates are relative to an A100 (= 1.0);
a GPU of unknown type ("", or a type without a rate) counts 1.0, as every GPU did before
types were rated.

Rates are Decimals so that the ledger's sums in SQL (NUMERIC) stay exact: totals of
weighted GPU-seconds by tenant, by job and by GPU agree to the last digit, as raw ones do.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from types import MappingProxyType

# Our defaults, not a vendor's rating: each type's peak dense BF16/FP16 tensor throughput
# from its vendor datasheet (TFLOPS, without sparsity), over an A100's. Real speed-ups
# depend on the workload; sites that measured their own set ROTA_GPU_TYPE_RATES.
PEAK_TENSOR_TFLOPS: Mapping[str, int] = MappingProxyType({
    "v100": 125,  # FP16 tensor (SXM2)
    "t4": 65,
    "a10": 125,
    "l4": 121,
    "a100": 312,
    "l40s": 362,
    "h100": 989,  # SXM
    "h200": 989,
    "b200": 2250,
})
REFERENCE = "a100"
UNKNOWN_RATE = Decimal(1)
_PLACES = Decimal("0.0001")  # four decimals: a default's precision beyond its source's is noise
# A GPU type as nodes advertise it (gpus.gpu_type, VARCHAR(32)): a short lowercase word. A
# key that no node could advertise is a typo that would silently rate nothing.
_TYPE = re.compile(r"[a-z0-9][a-z0-9._-]{0,31}")


def _default_rates() -> dict[str, Decimal]:
    ref = Decimal(PEAK_TENSOR_TFLOPS[REFERENCE])
    return {t: (Decimal(tflops) / ref).quantize(_PLACES) for t, tflops in PEAK_TENSOR_TFLOPS.items()}


@dataclass(frozen=True)
class GpuRates:
    """Rate per GPU type; `rate` of a type not listed (or of "") is UNKNOWN_RATE."""

    table: Mapping[str, Decimal] = field(default_factory=_default_rates, hash=False)

    def __post_init__(self) -> None:
        # Frozen means frozen: a caller's dict changed later must not re-rate the ledger.
        object.__setattr__(self, "table", MappingProxyType(dict(self.table)))

    def rate(self, gpu_type: str) -> Decimal:
        return self.table.get(gpu_type, UNKNOWN_RATE)

    def rates(self, gpu_types: Sequence[str]) -> tuple[Decimal, ...]:
        return tuple(self.rate(t) for t in gpu_types)

    def merged(self, overrides: Mapping[str, Decimal]) -> GpuRates:
        """These rates with `overrides` replacing or adding types."""
        return GpuRates({**self.table, **overrides})

    def describe(self) -> str:
        """The table in the form parse_rates reads, sorted by type."""
        return ",".join(f"{t}={r.normalize():f}" for t, r in sorted(self.table.items()))


DEFAULT_RATES = GpuRates()


def parse_rate(gpu_type: str, text: str) -> Decimal:
    try:
        value = Decimal(text.strip())
    except InvalidOperation:
        raise ValueError(f"{gpu_type}: rate {text.strip()!r} is not a number") from None
    # Zero would make GPU time free (invisible to fairness); infinity or NaN breaks every sum.
    if not value.is_finite() or value <= 0:
        raise ValueError(f"{gpu_type}: rate must be a positive number, got {text.strip()!r}")
    return value


def parse_rates(text: str) -> dict[str, Decimal]:
    """"h100=3.2, a100=1" -> {"h100": Decimal("3.2"), "a100": Decimal("1")}; types are GPU
    types as nodes advertise them (case is folded: types are lowercase). Raises ValueError
    naming the first bad item; "" is no overrides."""
    out: dict[str, Decimal] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        name, sep, value = item.partition("=")
        gpu_type = name.strip().lower()
        if not sep:
            raise ValueError(f"{item.strip()!r}: expected TYPE=RATE, e.g. h100=3.2")
        if not gpu_type:
            raise ValueError(f"{item.strip()!r}: the GPU type must not be empty")
        if not _TYPE.fullmatch(gpu_type):
            raise ValueError(
                f"{item.strip()!r}: a GPU type is up to 32 lowercase letters, digits, '.', '_' and '-',"
                " starting with a letter or digit"
            )
        if gpu_type in out:
            raise ValueError(f"{gpu_type}: given twice")
        out[gpu_type] = parse_rate(gpu_type, value)
    return out


def rates_from_text(text: str, base: GpuRates = DEFAULT_RATES) -> GpuRates:
    """`base` (the defaults) with the types `text` lists replaced or added."""
    return base.merged(parse_rates(text))
