"""`--stand-ins` and the check every command that starts executors makes first (serve, check, bench)."""

from __future__ import annotations

import argparse
import sys
from stagevisor.supervisor.errors import StagevisorError
from stagevisor.supervisor.plan import Plan


def add_stand_ins_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--stand-ins",
        action="store_true",
        help="run a seed model's stand-in executors (its stages and handoffs, speaking with the default "
        "hibari voice, not the model's weights); without it such a model stops before any worker starts",
    )


def ensure_runnable(plan: Plan, args: argparse.Namespace, command: str) -> None:
    """Raise StagevisorError (STAND_IN_NOT_REQUESTED) before anything starts.

    When stand-ins were asked for, say so on stderr: the operator reads that
    the audio is not the model's own.
    """
    import shlex

    from stagevisor.models.requirements import STANDINS_FLAG, check_runnable, standin_stages

    typed = args.command_line  # set by cli.main; None when a handler is called with a namespace parse_args made
    again = shlex.join(["stagevisor", *typed, STANDINS_FLAG]) if typed else ""
    check_runnable(plan, stand_ins=args.stand_ins, command=command, again=again)
    standins = standin_stages(plan)
    if standins:
        print(
            f"note: model {plan.model!r} runs stand-ins for {', '.join(standins)}: the model's stages and "
            "handoffs, speaking with the default hibari voice, not the model's weights (--stand-ins)",
            file=sys.stderr,
        )


def refuse_unmet(plan: Plan) -> None:
    """Raise StagevisorError (MISSING_DEPENDENCY, MISSING_REQUIREMENT) naming everything the plan lacks here (an
    extra, the model's checkpoint), each led by its code as `serve` and `check` print it before any worker starts;
    for commands that report it as an error object (bench)."""
    from stagevisor.models.requirements import unmet_requirements

    unmet = unmet_requirements(plan)
    if unmet:
        raise StagevisorError(
            unmet[0].code,
            "; ".join(f"{item.code.value}: {item.message}" for item in unmet),
            stages=tuple(dict.fromkeys(stage for item in unmet for stage in item.stages)),
        )
