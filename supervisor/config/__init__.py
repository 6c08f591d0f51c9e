"""Pipeline configuration: the YAML schema, safe loading, and merging overrides onto a model.

Pure: takes text or data, returns frozen pydantic objects or raises ConfigError.
Every override yields a new object; a declaration is never mutated.

`pipeline.py` is what a pipeline declares (stages, edges, speech options) with
the checks of names and fractions; `file.py` the config file's schema and
merging its stage overrides onto a model; `validation.py` says what a
validation error means in an operator's words; `loading.py` reads and parses
the YAML, keeping where each entry is written (`locations.py`). Import the
names from here.
"""

from stagevisor.supervisor.config.file import (
    MAX_REPLICAS,
    AutoscaleConfig,
    ConfigFile,
    PlacementConfig,
    ProcessConfig,
    StageOverride,
    check_replicas,
    replicas_from_text,
    merge_overrides,
)
from stagevisor.supervisor.config.loading import (
    SourcedConfig,
    config_key_lines,
    load_config,
    load_config_source,
    parse_config_source,
    parse_config_text,
)
from stagevisor.supervisor.config.pipeline import (
    DEFAULT_SEED_MAXIMUM,
    NAME_PATTERN,
    OPTION_TYPES,
    EdgeName,
    EdgeResources,
    OptionSpec,
    PipelineConfig,
    ResourcesConfig,
    RuntimeConfig,
    SpeechConfig,
    StageConfig,
    check_fraction,
)

__all__ = [
    "DEFAULT_SEED_MAXIMUM",
    "MAX_REPLICAS",
    "NAME_PATTERN",
    "OPTION_TYPES",
    "AutoscaleConfig",
    "ConfigFile",
    "EdgeName",
    "EdgeResources",
    "OptionSpec",
    "PipelineConfig",
    "PlacementConfig",
    "ProcessConfig",
    "ResourcesConfig",
    "RuntimeConfig",
    "SourcedConfig",
    "SpeechConfig",
    "StageConfig",
    "StageOverride",
    "check_fraction",
    "check_replicas",
    "replicas_from_text",
    "config_key_lines",
    "load_config",
    "load_config_source",
    "merge_overrides",
    "parse_config_source",
    "parse_config_text",
]
