"""``make install``'s installer: ``uv pip install`` into this interpreter's environment, from the
package sources pip is configured with; pip itself where uv cannot be had.

    python -m tools.install -e '.[dev]'     # what make install runs in .venv

uv installs the same requirements as pip (pyproject.toml's ranges, pip's constraint files) in
about a third of the time: it unpacks wheels and compiles their bytecode on every core, where
pip does both on one (on the 2-core AVX2 EPYC: 68 s against 177 s for ``.[dev]``, most of it
torch). uv reads no pip configuration, so the sources pip would use (``pip config list``: its
configuration files and ``PIP_*`` variables) are passed on, with pip's rule of the best version
across every index (``--index-strategy unsafe-best-match``) and its bytecode
(``--compile-bytecode``: where ``PYTHONDONTWRITEBYTECODE`` is set, an uncompiled torch would
take seconds longer to import in every process).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys

# pip's configuration keys and the uv options that take the same values (each value one option)
OPTIONS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url",
           "find-links": "--find-links", "constraint": "--constraint"}
# pip install's configuration sections, lowest precedence first (pip's ConfigOptionParser:
# "global", the command's name, then the environment's PIP_* variables)
SECTIONS = ("global", "install", ":env:")


def pip_config() -> dict[str, list[str]]:
    """The values ``pip install`` uses, by key (``global.find-links`` and ``PIP_FIND_LINKS``
    alike are ``find-links``): as pip's option parser reads them, the sections ``global``, then
    ``install``, then the ``PIP_*`` variables (``:env:``), a later one replacing a key's whole
    value (a list too); other commands' sections do not apply."""
    listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"], check=True,
                             capture_output=True, text=True).stdout
    by_section: dict[str, dict[str, list[str]]] = {section: {} for section in SECTIONS}
    for line in listing.splitlines():
        name, _, value = line.partition("=")  # global.extra-index-url='file:///a file:///b'
        section, _, key = name.partition(".")
        if section in by_section:
            by_section[section][key] = str(ast.literal_eval(value)).split()
    out: dict[str, list[str]] = {}
    for section in SECTIONS:
        out.update(by_section[section])
    return out


def uv_arguments(config: dict[str, list[str]]) -> list[str]:
    """The uv options that give ``uv pip install`` pip's sources, index rule and bytecode."""
    args = ["--index-strategy", "unsafe-best-match", "--compile-bytecode"]
    for key, option in OPTIONS.items():
        for value in config.get(key, []):
            args += [option, value]
    if config.get("no-index", ["false"])[-1].lower() in ("1", "true", "yes", "on"):
        args.append("--no-index")
    return args


def main(argv: list[str]) -> int:
    """Install ``argv`` (pip install's arguments) with uv, or with pip if uv cannot be had."""
    pip = [sys.executable, "-m", "pip", "install", "--quiet"]
    if subprocess.run([*pip, "uv"], check=False).returncode != 0:
        print("install: uv could not be installed; installing with pip", file=sys.stderr)
        return subprocess.run([*pip, *argv], check=False).returncode
    config = pip_config()
    env = dict(os.environ)
    if config.get("cert"):  # pip's certificate bundle, for the indexes it names
        env.setdefault("SSL_CERT_FILE", config["cert"][-1])
    command = [sys.executable, "-m", "uv", "pip", "install", "--python", sys.executable,
               "--quiet", *uv_arguments(config), *argv]
    return subprocess.run(command, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
