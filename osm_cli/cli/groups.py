"""Option groups: options that travel together, declared once as a frozen dataclass whose
fields are typer options, and taken by a command as one parameter of that type.

`grouped` spreads each such parameter into its fields' options, so that typer sees them flat
(in the group's order; panels.py files each under its panel by name), and gathers them back
into the group's record when the command runs. The groups: Scores (the six score options),
Inputs (the kernels' own inputs), Mods (FlexAttention's), Traced (the traced row), Model (the
kernel a model follows), Descales (FP8's), Shown (how much is shown). A group's methods turn
its values into the library's keywords; the library does the reading (io/) and the checking.

Example:
    @grouped
    def attention(files: FilesArg = None, *, scores: Scores, inputs: Inputs): ...
Leaves out: the options themselves (options.py), the commands.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing

from .options import (
    AlibiOpt,
    Align,
    BatchOpt,
    CausalAlignOpt,
    CausalOpt,
    CuSeqlensKOpt,
    CuSeqlensQOpt,
    DtypeOpt,
    ExplainOpt,
    HeadOpt,
    KDescaleOpt,
    KernelOpt,
    KvLayout,
    KvLayoutOpt,
    Layout,
    LayoutOpt,
    MaskModOpt,
    MaskOpt,
    MmaOpt,
    PageTableOpt,
    QDescaleOpt,
    QueryOpt,
    ScaleOpt,
    ScoreModOpt,
    SeqOpt,
    SequsedKOpt,
    ShowAllOpt,
    SinksOpt,
    SoftcapOpt,
    StepOpt,
    VDescaleOpt,
    WindowOpt,
)


def group(cls):
    """A frozen dataclass whose fields are options, spread into a command by `grouped`."""
    cls = dataclasses.dataclass(frozen=True)(cls)
    cls.__option_group__ = True
    return cls


def _is_group(annotation) -> bool:
    return inspect.isclass(annotation) and getattr(annotation, "__option_group__", False)


def grouped(fn):
    """Spread each parameter of `fn` typed as a group into the group's options; at run time,
    give `fn` the group's record built from them. The innermost decorator (under @guarded,
    @exports)."""
    sig = inspect.signature(fn, eval_str=True)
    params, groups, hints = [], {}, {}
    for p in sig.parameters.values():
        if not _is_group(p.annotation):
            params.append(p)
            hints[p.name] = p.annotation
            continue
        own = typing.get_type_hints(p.annotation, include_extras=True)
        groups[p.name] = (p.annotation, [f.name for f in dataclasses.fields(p.annotation)])
        for f in dataclasses.fields(p.annotation):
            params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY,
                                            default=f.default, annotation=own[f.name]))
            hints[f.name] = own[f.name]

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        for name, (cls, names) in groups.items():
            kwargs[name] = cls(**{n: kwargs.pop(n) for n in names if n in kwargs})
        return fn(*args, **kwargs)

    wrapper.__signature__ = sig.replace(parameters=params)
    wrapper.__annotations__ = hints
    return wrapper


def _value(x):
    """An Enum choice's value (typer gives members; a Python caller may give the string)."""
    return getattr(x, "value", x)


@group
class Scores:
    """How scores are made and masked (attention, backward, check, sweep)."""

    causal: CausalOpt = False
    causal_align: CausalAlignOpt = Align.bottom_right
    window: WindowOpt = None
    mask: MaskOpt = None
    scale: ScaleOpt = None
    layout: LayoutOpt = Layout.bhnd

    @property
    def given(self) -> bool:
        """Any of them differs from its default."""
        return self != Scores()

    def keywords(self) -> dict:
        """io.score_options' keywords."""
        return {"causal": self.causal, "causal_align": _value(self.causal_align),
                "window_size": self.window, "attn_mask": self.mask,
                "softmax_scale": self.scale, "layout": _value(self.layout)}


@group
class Inputs:
    """The kernels' own inputs, under their argument names (attention, backward, check)."""

    softcap: SoftcapOpt = None
    alibi: AlibiOpt = None
    sinks: SinksOpt = None
    cu_seqlens_q: CuSeqlensQOpt = None
    cu_seqlens_k: CuSeqlensKOpt = None
    seqused_k: SequsedKOpt = None
    page_table: PageTableOpt = None
    kv_layout: KvLayoutOpt = KvLayout.nhd

    def keywords(self) -> dict:
        """io.kernel_inputs' keywords."""
        return {"softcap": self.softcap, "alibi_slopes": self.alibi,
                "learnable_sink": self.sinks, "cu_seqlens_q": self.cu_seqlens_q,
                "cu_seqlens_k": self.cu_seqlens_k, "seqused_k": self.seqused_k,
                "page_table": self.page_table, "kv_layout": _value(self.kv_layout) or "nhd"}


@group
class Mods:
    """FlexAttention's score_mod and mask_mod, as specs (attention, backward, check, sweep,
    trace)."""

    score_mod: ScoreModOpt = None
    mask_mod: MaskModOpt = None

    def keywords(self) -> dict:
        return {"score_mod": self.score_mod, "mask_mod": tuple(self.mask_mod or ()) or None}


def score_options(scores: Scores, q=None, inputs: Inputs | None = None,
                  mods: Mods | None = None):
    """The command's ScoreOptions, its files read (io.score_options); a scale of 0 or below is
    legal, and said to be unusual on stderr."""
    from osm_cli import io
    from osm_cli.flash.options import scale_note

    from .common import note

    note(scale_note(scores.scale))
    given = {**({} if inputs is None else inputs.keywords()),
             **({} if mods is None else mods.keywords())}
    return io.score_options(q, **scores.keywords(), inputs=given or None)


@group
class Traced:
    """The traced row: batch (or a packed batch's sequence), head, query or queries."""

    batch: BatchOpt = 0
    head: HeadOpt = 0
    query: QueryOpt = None
    seq: SeqOpt = None

    def at(self) -> tuple:
        """The library's trace_at: (batch or seq, head, query), several queries a tuple."""
        query = [0] if self.query is None else self.query
        if not isinstance(query, int):  # --query's list (options.query_rows): one is an int
            query = int(query[0]) if len(query) == 1 else tuple(int(i) for i in query)
        return (self.batch if self.seq is None else self.seq, self.head, query)


@group
class Model:
    """The dtype and the kernel whose arithmetic a model follows."""

    dtype: DtypeOpt = None
    kernel: KernelOpt = None
    mma: MmaOpt = None

    @property
    def name(self) -> str | None:
        return _value(self.kernel)

    @property
    def mma_value(self) -> str | None:
        """--mma's value; None: the library's default (presets.mma_for)."""
        return _value(self.mma)


@group
class Descales:
    """FP8's descale factors, three files (attention, check)."""

    q_descale: QDescaleOpt = None
    k_descale: KDescaleOpt = None
    v_descale: VDescaleOpt = None

    def read(self):
        """As precision.descale.Descale (None when none is given)."""
        from osm_cli import io

        return io.read_descales(self.q_descale, self.k_descale, self.v_descale)


@group
class Shown:
    """How much a traced run shows: every tile, one at a time, with its arithmetic."""

    show_all: ShowAllOpt = False
    step: StepOpt = False
    explain: ExplainOpt = False


__all__ = ["Descales", "Inputs", "Model", "Mods", "Scores", "Shown", "Traced", "group",
           "grouped", "score_options"]
