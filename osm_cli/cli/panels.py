"""The groups `--help` lists a command's options in (typer's rich_help_panel), one table for
every command, and the click command class that prints them as sections of plain help (osm's
help stays plain text: `osm --help` loads no rich, tests/api/test_api.py).

An option declared with its own rich_help_panel keeps it; the others take PANELS' group for
their parameter name (COMMAND_PANELS where one command means something else by the name);
the rest are listed under "Options".
Leaves out: the options themselves (options.py), the commands.
"""

from __future__ import annotations

import inspect

import typer.core

# panel -> the parameter names it groups, in the order the panels are printed
PANELS = {
    "Scores": ("values", "random"),
    "Masking": ("causal", "causal_align", "window", "mask", "scale", "layout", "score_mod",
                "mask_mod"),
    "Tiling": ("block", "blocks", "block_q", "block_k", "form", "order", "seed", "splits",
               "rescale_threshold"),
    "Trace": ("row", "batch", "head", "query", "key", "seq", "show_all", "step", "explain"),
    "Precision & kernel": ("dtype", "precision", "accum", "kernel", "mma", "masked_lse",
                           "input_dtype", "grad_rule", "no_model", "no_reference", "lse_base"),
    "Kernel inputs": ("softcap", "alibi", "sinks", "sink", "cu_seqlens_q", "cu_seqlens_k",
                      "seqused_k", "page_table", "kv_layout", "q_descale", "k_descale",
                      "v_descale"),
    "Verdict": ("rule", "rules_table", "no_probe", "strict"),
    "Kernel tensors": ("o_path", "lse", "do", "dq", "dk", "dv", "dq_path", "dk_path",
                       "dv_path", "block_mask"),
    "Cost model": ("seq_len", "head_dim", "heads", "dtype_bytes", "sram"),
    "Battery": ("features", "head_dims", "seqlens", "min_seqlen", "seqlen_multiple", "arrays",
                "device", "backend", "budget", "cases", "repeat", "replay", "max_failures",
                "no_shrink"),
    "Output": ("as_json", "csv", "plot", "svg", "html", "out_path", "lse_path", "top", "junit"),
}
# where a command's name means another thing: backward's --lse reads the forward's LSE, cost's
# --batch is the batch size, battery's --rule judges its cases (check's is a Verdict option)
COMMAND_PANELS = {
    "cost": {"batch": "Cost model"},
    "backward": {"lse_path": "Kernel tensors", "seed": "Scores"},
    "battery": {"rule": "Battery"},
}
_PANEL_OF = {name: panel for panel, names in PANELS.items() for name in names}


def panel_of(command: str | None, name: str | None) -> str:
    """The group an option of `command` called `name` is listed in."""
    return COMMAND_PANELS.get(command or "", {}).get(name) or _PANEL_OF.get(name, "Options")


class PanelledCommand(typer.core.TyperCommand):
    """A command whose --help lists its options in panels (PANELS' order, then Options), and
    whose summary in `osm --help` is its help's first paragraph, whole."""

    def get_short_help_str(self, limit: int = 45) -> str:
        """The first paragraph of the help, never cut: click's default cuts it to fit the
        line with "..." ("Judge a kernel's output (and LSE) the way..." at 80 columns); the
        list of commands wraps it in its column instead."""
        if self.short_help:
            return self.short_help
        first = inspect.cleandoc(self.help or "").split("\n\n")[0]
        return " ".join(first.replace("\b", "").split())

    def format_options(self, ctx, formatter) -> None:
        args, groups = [], {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if param.param_type_name == "argument":
                args.append(record)
                continue
            panel = getattr(param, "rich_help_panel", None) or panel_of(self.name, param.name)
            groups.setdefault(panel, []).append(record)
        if args:
            with formatter.section("Arguments"):
                formatter.write_dl(args)
        for panel in sorted(groups, key=lambda p: [*PANELS, p].index(p)):
            with formatter.section(panel):
                formatter.write_dl(groups[panel])


class NumbersCommand(PanelledCommand):
    """A PanelledCommand whose arguments are numbers, negative ones too (`osm overflow-demo
    -inf -1 2`, which click would read as options): the numbers (every argument that reads as
    one and is no option's value) are handed to click after a "--", in their order, so that
    anything else starting with "-" that is not one of the command's options is click's own
    "No such option" (exit 2), as in every other command, not a bad number."""

    def parse_args(self, ctx, args):
        valued = {o for p in self.get_params(ctx) if p.param_type_name == "option"
                  and not getattr(p, "is_flag", False) and not getattr(p, "count", False)
                  for o in (*p.opts, *p.secondary_opts)}
        rest, numbers, i = [], [], 0
        while i < len(args):
            arg = args[i]
            if arg == "--":
                numbers += args[i + 1:]
                break
            if arg in valued:  # an option and its value, as they are
                rest += args[i:i + 2]
                i += 2
                continue
            (numbers if _number(arg) else rest).append(arg)
            i += 1
        return super().parse_args(ctx, [*rest, *(["--", *numbers] if numbers else [])])


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


__all__ = ["COMMAND_PANELS", "PANELS", "NumbersCommand", "PanelledCommand", "panel_of"]
