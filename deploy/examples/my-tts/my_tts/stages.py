"""A frontend that turns words into pitches and a vocoder that streams one tone per word."""

import asyncio

import numpy as np

from stagevisor.stages import InvalidRequest, StageContext, StagePayload


class Frontend:
    """Text -> one pitch (Hz) per word; rejects what it cannot say."""

    max_text_chars = 500  # the daemon refuses longer texts before any stage runs

    def __init__(self, base_hz: float) -> None:
        self.base_hz = base_hz

    async def process(self, payload: StagePayload, ctx: StageContext) -> dict:
        words = payload.request["text"].split()
        if not words:
            raise InvalidRequest("text has no words")
        try:
            speed = float(payload.request["options"].get("speed", "1.0"))  # options are strings
        except ValueError:
            raise InvalidRequest("speed must be a number") from None
        if not 0.25 <= speed <= 4.0:
            raise InvalidRequest(f"speed must be in [0.25, 4], got {speed}")
        pitches = np.array([self.base_hz * (1 + len(word) / 10) for word in words], dtype=np.float32)
        return {"pitches": pitches, "seconds_per_word": 0.2 / speed}


class Vocoder:
    """Pitches -> audio: streams one tone per word to the client as soon as it is made."""

    def __init__(self, sample_rate: int) -> None:
        self.sample_rate = sample_rate

    def tone(self, hz: float, seconds: float) -> np.ndarray:
        t = np.arange(int(self.sample_rate * seconds), dtype=np.float32) / self.sample_rate
        return (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)

    async def process(self, payload: StagePayload, ctx: StageContext) -> None:
        for hz in payload.data["pitches"]:
            if ctx.cancelled:  # the client went away or the request failed elsewhere
                return None
            # Heavy synchronous work goes to a thread so the worker keeps serving other requests.
            audio = await asyncio.to_thread(self.tone, float(hz), payload.data["seconds_per_word"])
            await ctx.stream({"audio": audio, "sample_rate": self.sample_rate})
        return None


def make_frontend(base_hz: float = 220.0) -> Frontend:
    return Frontend(base_hz)


def make_vocoder(sample_rate: int = 16000, gpu_id: int | None = None) -> Vocoder:
    # gpu_id is passed because the signature asks for it: None here, the stage runs on CPU.
    return Vocoder(sample_rate)
