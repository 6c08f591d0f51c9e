"""The supervisor: config schema, placement planning, daemon, workers, data plane, admin API, CLI."""


def package_version() -> str:
    """The installed distribution's version, "unknown" when it is not installed (run from a checkout).

    The one answer of `stagevisor --version`, GET /version and the OpenAPI document's `info.version`.
    """
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("stagevisor")
    except PackageNotFoundError:
        return "unknown"
