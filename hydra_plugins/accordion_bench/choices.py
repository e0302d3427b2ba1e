"""One line for a misspelt config group option, with the closest choices.

Hydra answers ``compressor=powersdg`` with its message, the config search path and a hint about
HYDRA_FULL_ERROR (16 lines, exit status 1). Its defaults-list builder raises that message from
one function, ``hydra._internal.defaults_list.config_not_found_error``; :func:`install` replaces
it with one that names the group, the closest choices and all of them in one line:

    error: compressor=powersdg: no such option of group compressor; did you mean powersgd or
    powersgd_ours or powersgd_noef? choices: adacomp, ef_signsgd, none, powersgd, ...

On the command line (a run, a sweep, the sweeper composing its runs: inside Hydra's
``run_and_report``) the line goes to stderr and the process exits with status 2, as the suite's
other bad input does, before any process group starts; through the Compose API it is the message
of Hydra's ``MissingConfigException``. The package's ``__init__`` installs it: Hydra imports the
package while discovering its plugins, before it composes anything. A missing primary config and
a missing non-group config keep Hydra's own message.
"""

import difflib
import sys
from typing import Any

CLOSE = 3  # how many close choices to offer


def one_line(group: str, option: str, options: list[str], parent: str | None) -> str:
    """The message for ``group=option`` missing from ``options`` (selected in ``parent``)."""
    close = difflib.get_close_matches(option, options, n=CLOSE, cutoff=0.6)
    where = f" (selected in {parent})" if parent else ""
    guess = f"; did you mean {' or '.join(close)}?" if close else ";"
    return (f"error: {group}={option}: no such option of group {group}{where}{guess} "
            f"choices: {', '.join(options)}")


def install() -> None:
    """Replace Hydra's missing-option error with :func:`one_line` (idempotent)."""
    from hydra._internal import defaults_list
    from hydra._internal.utils import run_and_report
    from hydra.core.default_element import GroupDefault
    from hydra.core.object_type import ObjectType
    from hydra.errors import MissingConfigException

    hydras = defaults_list.config_not_found_error
    if getattr(hydras, "one_line", False):
        return

    def config_not_found_error(repo: Any, tree: Any) -> None:
        element = tree.node
        if not isinstance(element, GroupDefault) or element.primary:
            hydras(repo=repo, tree=tree)
            return
        group = element.get_group_path()
        options = repo.get_group_options(group, ObjectType.CONFIG)
        parent = tree.parent.node if tree.parent is not None else None
        shown = parent.get_config_path() if parent is not None and not parent.primary else None
        message = one_line(group, element.get_name(), options, shown)
        if _inside(run_and_report):
            print(message, file=sys.stderr, flush=True)
            sys.exit(2)
        raise MissingConfigException(message, missing_cfg_file=element.get_config_path(),
                                     options=options)

    config_not_found_error.one_line = True  # type: ignore[attr-defined]
    defaults_list.config_not_found_error = config_not_found_error


def _inside(function: Any) -> bool:
    """Whether ``function`` is on the calling stack (Hydra's CLI runs the app inside it)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is function.__code__:
            return True
        frame = frame.f_back
    return False
