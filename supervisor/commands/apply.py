"""`stagevisor apply`: move the running daemon to a new topology, planned by the same rules as `stagevisor plan`."""

from __future__ import annotations

import argparse
import json
import sys

from stagevisor.supervisor.commands.admin import add_admin_options, call, placement_refusal, report_refusal, run


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    apply = subparsers.add_parser(
        "apply",
        help="move the running daemon to a new topology without failing a request",
        description="Plan the new topology from the same inputs as `stagevisor plan` (the same rules: an unsafe "
        "edge, a missing fraction or an over-budget GPU is refused with its code), print the difference from the "
        "running one (groups added, removed, changed, merged, split), then move the daemon to it: every worker of "
        "the new topology starts beside the running ones, new requests switch to it once all are READY, "
        "requests in flight finish on the old workers, then those stop. A refusal (including a new worker that "
        "fails to start, or a GPU that cannot hold both topologies during the switch) changes nothing. "
        "A --config's `voices` map (the names clients may send) replaces the daemon's with it, or alone where the "
        "topology stays as it is. --dry-run only prints the difference, or the refusal the apply would meet before "
        "starting a worker.",
        epilog="examples:\n  stagevisor apply --isolate-stage vocoder --dry-run\n"
        "  stagevisor apply --isolate-stage vocoder\n  stagevisor apply            # back to the declared topology\n"
        "  stagevisor apply --config deploy/examples/vocoder-own-process.yaml --format json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from stagevisor.supervisor.commands.placement_options import add_placement_options

    add_placement_options(apply)
    add_admin_options(apply, formats=True)
    apply.add_argument(
        "--dry-run",
        action="store_true",
        help="print the difference (or the refusal the apply would meet) and change nothing",
    )
    apply.set_defaults(handler=_apply)


def _apply(args: argparse.Namespace) -> int:
    from stagevisor.supervisor.commands.placement_options import request_from_args
    from stagevisor.supervisor.config.voices import VoiceNamesChange
    from stagevisor.supervisor.placement.diff import TopologyDiff
    from stagevisor.supervisor.placement.request import plan_placement

    request = request_from_args(args)
    plan_placement(request)  # the same rules here first: a refusal prints its code like `plan` (exit 2)
    text = None
    if request.config_path is not None:
        with open(request.config_path, encoding="utf-8") as config:
            text = config.read()

    def body() -> int:
        import grpc

        from stagevisor.supervisor._proto import admin_pb2

        message = admin_pb2.ApplyRequest(
            isolate_stages=request.isolate_stages,
            stage_processes=request.stage_processes,
            process_replicas=request.process_replicas,
            dry_run=args.dry_run,
        )
        for field, value in (("model_path", request.model_path), ("config_path", request.config_path)):
            if value is not None:
                setattr(message, field, value)
        if text is not None:
            message.config_text = text
        try:
            # Requests in flight on the old topology may run up to the daemon's request timeout.
            reply = call(args, lambda stub: stub.Apply(message, timeout=3600))
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.FAILED_PRECONDITION:
                refusal = placement_refusal(error)
                if refusal is not None:
                    raise refusal from None
                return report_refusal(args, error)
            raise
        diff, plan = json.loads(reply.diff_json), json.loads(reply.plan_json)
        voices = json.loads(reply.voices_json) if reply.voices_json else None
        if args.format == "json":
            answer = {
                "changed": reply.changed,
                "applied": reply.applied,
                "dry_run": args.dry_run,
                "diff": diff,
                "plan": plan,
            }
            if voices is not None:  # taken with the topology, or alone at once: applied unless a dry run
                answer["voices"] = {**voices, "applied": bool(voices.get("changed")) and not args.dry_run}
            print(json.dumps(answer))
            return 0
        print(TopologyDiff.from_json(diff).render())
        names = VoiceNamesChange.from_json(voices) if voices is not None else VoiceNamesChange({}, {})
        if names.changed:
            print(names.render())
        if args.dry_run:
            if reply.changed or names.changed:
                print("dry run: nothing changed")
        else:
            if reply.applied:
                print("applied: the daemon runs the new topology")
            if names.changed:
                print("applied: clients may send the new voice names")
        for problem in names.unknown if names.changed else ():
            print(f"warning: {problem}", file=sys.stderr)
        return 0

    return run(args, body)
