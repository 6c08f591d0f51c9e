"""--format table|json: one declaration for every command that prints a table or one JSON object (and, with json,
its error as `{"error": {...}}` on stdout)."""

from __future__ import annotations

import argparse


def add_format_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=("table", "json"), default="table", help="output format (default: table)")
