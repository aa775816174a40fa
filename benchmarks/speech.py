"""Real speech for the corpus's audio model (Silero VAD): recordings from the pocketsphinx source
distribution on PyPI (LibriVox readings of "Sense and Sensibility", public domain, and short
command recordings; 16 kHz mono 16-bit), fetched by pinned version and sha256, turned into the
named .npz feeds the model takes: 16 frames of 512 samples, each with the 64 samples before it
(Silero's own `frame_blocks`), and the LSTM state the float model carries into that block.

Calibration and evaluation come from different recordings (corpus/README.md lists which).
"""

from __future__ import annotations

import io
import tarfile
import wave
from pathlib import Path

import numpy as np
from _sdist import fetch_sdist

SDIST = {
    "package": "pocketsphinx",
    "version": "5.1.1",
    "sha256": "675778b309a22dfc9b7d37f7621976bba491d2a5f8c59696bd77fd6d07271355",
}
DATA = "pocketsphinx-5.1.1/test/data/"
CALIBRATION = [
    "librivox/sense_and_sensibility_01_austen_64kb-0870.wav",
    "librivox/sense_and_sensibility_01_austen_64kb-0890.wav",
    "librivox/sense_and_sensibility_01_austen_64kb-0930.wav",
    "cards/001.wav",
    "cards/002.wav",
    "cards/003.wav",
    "cards/004.wav",
    "cards/005.wav",
]
EVALUATION = [
    "librivox/sense_and_sensibility_01_austen_64kb-0880.wav",
    "librivox/sense_and_sensibility_01_austen_64kb-0920.wav",
    "forever/input_2_16k.wav",
    "forever/input_4_16k.wav",
]
FRAMES, FRAME, CONTEXT = 16, 512, 64  # one feed: 16 frames of 32 ms at 16 kHz


# The tuning split: the calibration recordings alone, five to calibrate and three to judge on
# (the evaluation recordings are not read).
VALIDATION = {
    "calib": [CALIBRATION[i] for i in (0, 2, 3, 5, 7)],
    "eval": [CALIBRATION[i] for i in (1, 4, 6)],
}


def recordings(archive: Path, names: list[str]) -> dict[str, np.ndarray]:
    """Each recording as float32 samples in [-1, 1)."""
    out = {}
    with tarfile.open(archive) as tar:
        for name in names:
            with wave.open(io.BytesIO(tar.extractfile(DATA + name).read())) as w:
                assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (16000, 1, 2), name
                pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2")
            out[name] = pcm.astype(np.float32) / 32768
    return out


def blocks(audio: np.ndarray) -> list[np.ndarray]:
    """[FRAMES, CONTEXT + FRAME] blocks as Silero's frame_blocks makes them (whole blocks only)."""
    frames = audio[: len(audio) // FRAME * FRAME].reshape(-1, FRAME)
    contexts = np.concatenate([np.zeros((1, CONTEXT), np.float32), frames[:-1, -CONTEXT:]])
    rows = np.concatenate([contexts, frames], axis=1)
    return [rows[k : k + FRAMES] for k in range(0, len(rows) - FRAMES + 1, FRAMES)]


def write_feeds(model_path: Path, dest: Path, cache: Path, validation: bool = False) -> dict[str, int]:
    """data/speech/{calib,eval}/*.npz under `dest`; returns the number of feeds of each.
    `validation`: the split defaults are tuned on, the calibration recordings only (VALIDATION)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    archive = fetch_sdist(SDIST, cache)
    counts = {}
    split = VALIDATION if validation else {"calib": CALIBRATION, "eval": EVALUATION}
    for role, names in split.items():
        folder = dest / role
        folder.mkdir(parents=True, exist_ok=True)
        count = 0
        for name, audio in recordings(archive, names).items():
            h = c = np.zeros((1, 1, 128), np.float32)
            for k, block in enumerate(blocks(audio)):
                stem = name.replace("/", "_").removesuffix(".wav")
                np.savez(folder / f"{stem}-{k:02d}.npz", input=block, h=h, c=c)
                _, h, c = session.run(None, {"input": block, "h": h, "c": c})
                count += 1
        counts[role] = count
    return counts
