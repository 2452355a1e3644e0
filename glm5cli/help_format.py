"""Command lists in `--help` give each command's first sentence whole, wrapped at the terminal's width, instead of
click's cut at the column where the line ends ("Train the MTP layer on the model's own output so that more...").
Every Typer app of glm5 uses this group class (`typer.Typer(cls=WholeSummaries)`)."""

from __future__ import annotations

import re

from typer.core import TyperGroup


def first_sentence(text: str | None) -> str:
    """The first sentence of a command's help (its first paragraph when that has no full stop)."""
    para = re.split(r"\n\s*\n", (text or "").strip(), maxsplit=1)[0]
    para = " ".join(para.replace("\b", " ").split())
    m = re.match(r"(.+?[.!?])(\s|$)", para)
    return m.group(1) if m else para


class WholeSummaries(TyperGroup):
    def format_commands(self, ctx, formatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, cmd.short_help or first_sentence(cmd.help)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)
