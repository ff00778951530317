"""What the Debian package generates at build time, so none of it can drift from the
program: nftrec(8) from the CLI's own click tree (every command and option with its help),
nftrec.yaml(5) from schemas/nodeconfig.json (every key with its type, allowed values and
description), /etc/nftrec/config.yaml (README's node config reference, commented out:
nothing changes until edited) and the bash, zsh and fish completion scripts.
Run with the package's own virtualenv: `python debian/docs.py OUTDIR` (debian/rules).
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

TOP = Path(__file__).resolve().parent.parent
COMPLETIONS = {"bash": "bash-completion/completions/nftrec", "zsh": "zsh/vendor-completions/_nftrec",
               "fish": "fish/vendor_completions.d/nftrec.fish"}


def roff(text: str) -> str:
    """Plain text as roff: backslashes and hyphens escaped, no line starting with a control
    character, blank lines as paragraph breaks."""
    out = []
    for line in text.replace("\\", "\\e").replace("-", "\\-").splitlines():
        line = line.strip()
        out.append(".PP" if not line else ("\\&" + line if line[0] in ".'" else line))
    return "\n".join(out)


def date() -> str:
    import time

    return time.strftime("%Y-%m-%d", time.gmtime(int(os.environ.get("SOURCE_DATE_EPOCH", "0"))))


def header(name: str, section: int, title: str) -> str:
    from reconciler import __version__

    return (f'.TH {roff(name.upper())} {section} "{date()}" "nftrec {__version__}" "nftrec"\n'
            f".SH NAME\n{roff(name)} \\- {roff(title)}\n")


def options(command) -> list[str]:
    """One .TP entry per option of a click command (help options left out)."""
    out = []
    for param in command.params:
        if getattr(param, "hidden", False) or param.param_type_name == "argument":
            continue
        names = ", ".join(param.opts + param.secondary_opts)
        if not getattr(param, "is_flag", False) and param.metavar != "":
            names += " " + (param.metavar or param.type.name.upper())
        text = param.help or ""
        if getattr(param, "show_default", False) and param.default not in (None, False, ""):
            text += f" [default: {param.default}]"
        out += [".TP", f"\\fB{roff(names)}\\fR", roff(text) or "(no help)"]
    return out


def usage(path: list[str], command) -> str:
    ctx = command.context_class(command, info_name=" ".join(path))
    return " ".join(command.collect_usage_pieces(ctx))


def commands(group, path: list[str]) -> list[str]:
    """Every command under a click group, depth first, in the order `--help` lists them.
    click's own classes only through the objects (typer vendors click from 0.24 on)."""
    out = []
    ctx = group.context_class(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is None or command.hidden:
            continue
        full = path + [name]
        out += [".SS " + roff(" ".join(full)), f".B {roff(' '.join(full))}", roff(usage(full, command)),
                ".PP", roff(command.help or command.short_help or "")]
        out += options(command)
        if hasattr(command, "list_commands"):
            out += commands(command, full)
    return out


def nftrec_8() -> str:
    import typer

    from reconciler.cli import typer_app

    group = typer.main.get_command(typer_app())
    lines = [header("nftrec", 8, "kube-proxy's nftables mode without Kubernetes"), ".SH SYNOPSIS",
             ".B nftrec", "[\\fIGLOBAL OPTIONS\\fR] \\fICOMMAND\\fR [\\fIARGS\\fR]...", ".SH DESCRIPTION",
             roff(group.help or ""), ".SH GLOBAL OPTIONS"]
    lines += options(group)
    lines += [".SH COMMANDS"] + commands(group, ["nftrec"])
    lines += [".SH FILES", ".TP", "/etc/nftrec/config.yaml",
              "The node config (see \\fBnftrec.yaml\\fR(5)).", ".TP", "/var/lib/nftrec",
              "The state directory: what was applied, when, and the last rulesets applied.",
              ".SH EXIT STATUS", "0 ok; 1 error; 2 changes or drift where a command says so; 3 held;"
              " 64 usage error.", ".SH SEE ALSO", "\\fBnftrec.yaml\\fR(5), \\fBnft\\fR(8),"
              " /usr/share/doc/nftrec/README.md.gz"]
    return "\n".join(lines) + "\n"


def schema_keys(schema: dict, prefix: str = "") -> list[tuple[str, dict]]:
    """(dotted key, its schema) for every property, nested objects and list items too."""
    out = []
    for key, sub in schema.get("properties", {}).items():
        out.append((prefix + key, sub))
        out += schema_keys(sub, prefix + key + ".")
        items = sub.get("items")
        if isinstance(items, dict):
            out += schema_keys(items, prefix + key + "[].")
    return out


def describe(sub: dict) -> str:
    parts = []
    kind = sub.get("type")
    if kind:
        parts.append("Type: " + (" or ".join(kind) if isinstance(kind, list) else kind) + ".")
    if "const" in sub:
        parts.append(f"Must be {sub['const']}.")
    if "enum" in sub:
        parts.append("One of: " + ", ".join(map(str, sub["enum"])) + ".")
    if isinstance(sub.get("items"), dict) and sub["items"].get("type"):
        parts.append(f"Items: {sub['items']['type']}.")
    if sub.get("description") and sub["description"] != sub.get("const"):
        parts.append(sub["description"].rstrip(".") + ".")
    return " ".join(parts)


def reference_block() -> str:
    """README's node config reference: the YAML block under its "### Node config"."""
    readme = (TOP / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n### Node config\n", 1)[1]
    return re.search(r"```yaml\n(.*?)```", section, re.S).group(1)


def nftrec_yaml_5() -> str:
    schema = json.loads((TOP / "schemas" / "nodeconfig.json").read_text(encoding="utf-8"))
    lines = [header("nftrec.yaml", 5, "the nftrec node config"), ".SH SYNOPSIS", "/etc/nftrec/config.yaml",
             ".SH DESCRIPTION",
             roff("The node config of nftrec(8): what belongs to this node and not to the shared manifest "
                  "repository. Read from --config FILE, else /etc/nftrec/config.yaml when it exists, else "
                  "every key takes its default. A file of comments only is all defaults. Unknown keys are "
                  "errors, except keys starting with x-, which are ignored."), ".SH KEYS"]
    for key, sub in schema_keys(schema):
        lines += [".TP", f"\\fB{roff(key)}\\fR", roff(describe(sub))]
    lines += [".SH EXAMPLE", "Every key, with its default or an example value:", ".PP", ".nf",
              roff(reference_block()).replace(".PP", ""), ".fi", ".SH SEE ALSO", "\\fBnftrec\\fR(8)"]
    return "\n".join(lines) + "\n"


def config_sample() -> str:
    lines = ["# nftrec's node config (nftrec.yaml(5)). Every line is a comment, so nftrec runs with",
             "# its defaults until you edit it. Uncomment and change what this node needs, then",
             "# check it: nftrec validate --config /etc/nftrec/config.yaml DIR", "#"]
    lines += [("# " + line).rstrip() for line in reference_block().splitlines()]
    return "\n".join(lines) + "\n"


def completion(shell: str) -> str:
    from typer import completion as typer_completion

    return typer_completion.get_completion_script(prog_name="nftrec", complete_var="_NFTREC_COMPLETE",
                                                  shell=shell)


def generate(out: Path) -> list[Path]:
    """Writes every generated file under out (man/, completions/, config.yaml)."""
    files = {out / "man" / "nftrec.8": nftrec_8(), out / "man" / "nftrec.yaml.5": nftrec_yaml_5(),
             out / "config.yaml": config_sample()}
    for shell, path in COMPLETIONS.items():
        files[out / "completions" / path] = completion(shell).rstrip("\n") + "\n"
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return sorted(files)


if __name__ == "__main__":
    for written in generate(Path(sys.argv[1])):
        print(written)
