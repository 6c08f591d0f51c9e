"""Loading a Qwen3-TTS checkpoint onto a stage's device, once per process, with qwen-tts's own classes.

The talker (with its code predictor, text embeddings and, on Base checkpoints,
the speaker encoder) and the speech tokenizer load through
`Qwen3TTSModel.from_pretrained`, placed on the engine group's device. The
loaded model is kept in a process-local table keyed by checkpoint directory:
preprocessing embeds its prompts with that model's text embeddings, which is
why preprocessing -> tts_engine must share a process. A vocoder in another
process loads only the speech tokenizer, on its own group's device.

One named workaround: `Qwen3TTSSpeakerEncoderConfig` takes no extra keyword
arguments, so it cannot read back the `model_type` key that `save_pretrained`
writes into `speaker_encoder_config`: `Qwen3TTSModel.from_pretrained` fails on
such a checkpoint, in the model's config and again in AutoProcessor, which
re-reads config.json. `checkpoint_config` drops the keys the class does not
take, and `load_model` builds the package's wrapper from its parts (the model
class's own from_pretrained with that config, the processor class's own
from_pretrained, which reads only the tokenizer files), as the wrapper's
from_pretrained does (tests/integration/test_qwen3_stages.py).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from stagevisor.stages.qwen3.checkpoint import Checkpoint, CheckpointError, config_mismatch, read_config
from stagevisor.stages.qwen3.package import import_qwen_tts
from stagevisor.stages.qwen3.steps import Talker, own_loop_refusal

log = logging.getLogger(__name__)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

_lock = threading.Lock()
_models: dict[Path, "LoadedModel"] = {}
_tokenizers: dict[tuple[Path, str], Any] = {}


@dataclass
class LoadedModel:
    """A checkpoint loaded in this process: the package's wrapper, its talker and where they live."""

    checkpoint: Checkpoint
    wrapper: Any
    """qwen_tts.Qwen3TTSModel: `.model` the Qwen3TTSForConditionalGeneration, `.processor` the text tokenizer."""
    talker: Talker
    device: torch.device

    @property
    def model(self) -> Any:
        return self.wrapper.model

    @property
    def speech_tokenizer(self) -> Any:
        return self.wrapper.model.speech_tokenizer


def device_for(gpu_id: int | None) -> torch.device:
    """The group's CUDA device, or the CPU when the stage has no GPU or none is present."""
    if gpu_id is not None and torch.cuda.is_available():
        return torch.device("cuda", gpu_id)
    return torch.device("cpu")


def dtype_for(name: str, checkpoint_dtype: str | None, device: torch.device) -> torch.dtype:
    """`auto`: the checkpoint's dtype on a GPU, float32 on the CPU (bfloat16 matmuls are slow there)."""
    if name == "auto":
        if device.type == "cuda" and checkpoint_dtype in DTYPES:
            return DTYPES[checkpoint_dtype]
        return torch.float32
    if name not in DTYPES:
        raise ValueError(f"dtype {name!r}: expected auto or one of {', '.join(DTYPES)}")
    return DTYPES[name]


def checkpoint_config(directory: Path) -> Any:
    """The checkpoint's Qwen3TTSConfig, less the speaker-encoder keys its config class cannot take (see above)."""
    import_qwen_tts()
    from qwen_tts.core.models import Qwen3TTSConfig
    from qwen_tts.core.models.configuration_qwen3_tts import Qwen3TTSSpeakerEncoderConfig

    data = read_config(directory)
    encoder = data.get("speaker_encoder_config")
    if isinstance(encoder, dict):
        accepted = set(inspect.signature(Qwen3TTSSpeakerEncoderConfig.__init__).parameters) - {"self"}
        data["speaker_encoder_config"] = {key: value for key, value in encoder.items() if key in accepted}
    return Qwen3TTSConfig.from_dict(data)


def _load_kwargs(device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    return {"device_map": str(device), "dtype": dtype, "local_files_only": True}


@contextlib.contextmanager
def _weights_of(directory: Path | str) -> Iterator[None]:
    """Loading `directory`'s weights: a file missing or unreadable there (truncated safetensors, a lost shard) is
    QWEN3_BAD_CHECKPOINT naming it, not the loader's own exception; running out of memory stays what it is.

    So is a config.json the package cannot build the model it describes from (a key of talker_config missing:
    the package's AttributeError) or that does not describe the weights beside it (a size changed: torch's
    `size mismatch` RuntimeError), which failed the start with those exceptions alone."""
    from safetensors import SafetensorError

    try:
        yield
    except torch.cuda.OutOfMemoryError:
        raise
    except (OSError, SafetensorError, ValueError) as error:
        raise CheckpointError(
            "QWEN3_BAD_CHECKPOINT",
            f"{str(directory)!r} cannot be loaded ({type(error).__name__}: {str(error)[:300]}); the checkpoint is "
            "incomplete or damaged: copy it again",
        ) from None
    except (AttributeError, KeyError, TypeError, RuntimeError) as error:
        if isinstance(error, RuntimeError) and "size mismatch" not in str(error):
            raise
        raise config_mismatch(directory, f"{type(error).__name__}: {str(error)[:300]}") from None


def load_model(checkpoint: Checkpoint, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    """The checkpoint loaded on `device` (once per process; a second stage on another device is refused)."""
    import_qwen_tts()
    from qwen_tts import Qwen3TTSModel
    from qwen_tts.core.models import Qwen3TTSForConditionalGeneration, Qwen3TTSProcessor

    with _lock:
        found = _models.get(checkpoint.directory)
        if found is not None:
            if found.device != device:
                raise RuntimeError(
                    f"{checkpoint.directory} is already loaded on {found.device} in this process; one process "
                    f"serves one talker, so this stage cannot also load it on {device}"
                )
            return found
        directory = str(checkpoint.directory)
        with _weights_of(directory):
            model = Qwen3TTSForConditionalGeneration.from_pretrained(
                directory, config=checkpoint_config(checkpoint.directory), **_load_kwargs(device, dtype)
            )
            processor = Qwen3TTSProcessor.from_pretrained(directory, fix_mistral_regex=True)
        model.eval()
        wrapper = Qwen3TTSModel(model=model, processor=processor, generate_defaults=model.generate_config)
        refusal = own_loop_refusal(model.talker.code_predictor)
        if refusal is not None:
            log.info("%s: %s, so the talker's decode steps go through the package's own code", directory, refusal)
        talker = Talker(wrapper.model, own_loop=refusal is None)
        loaded = LoadedModel(checkpoint=checkpoint, wrapper=wrapper, talker=talker, device=device)
        _models[checkpoint.directory] = loaded
        _tokenizers[(checkpoint.directory, str(device))] = wrapper.model.speech_tokenizer
        return loaded


def loaded_model(directory: Path) -> LoadedModel | None:
    """The model a tts_engine of this process loaded from `directory`, if any."""
    with _lock:
        return _models.get(directory)


def speech_tokenizer(checkpoint: Checkpoint, device: torch.device, dtype: torch.dtype) -> Any:
    """The checkpoint's speech tokenizer on `device`: the engine's own when it is on that device, else loaded alone."""
    import_qwen_tts()
    from qwen_tts import Qwen3TTSTokenizer

    key = (checkpoint.directory, str(device))
    with _lock:
        if key not in _tokenizers:
            directory = checkpoint.directory / "speech_tokenizer"
            with _weights_of(directory):
                _tokenizers[key] = Qwen3TTSTokenizer.from_pretrained(str(directory), **_load_kwargs(device, dtype))
        return _tokenizers[key]
