#!/usr/bin/env python3
"""Reference outputs of Silero VAD for cadence's Rust implementation (media/src/vad/silero.rs).

What it writes (all committed, read by media/tests/silero.rs and cli/tests/vad.rs; no test runs
Python):
- fixtures/vad/mix_16k.wav: a 16 kHz 16-bit mono test clip made from the committed speech
  clips (fixtures/speech/*.wav, 22.05 kHz, resampled here with scipy's polyphase filter),
  joined by pauses of several lengths (digital silence, faint noise, a noise burst), one clip at
  about 10 dB SNR. Being 16 kHz already, cadence's WAV reader passes it through unchanged, so
  the Rust side feeds the model exactly the samples ONNX Runtime was fed here.
- fixtures/vad/silero_reference.json: per 512-sample chunk speech probabilities from ONNX
  Runtime on the committed model file (media/models/silero_vad_openvino_16k.onnx, the one cadence
  runs), through the wheel's own `OnnxWrapper` (context concatenation, state carry); the same
  for the wheel's default `silero_vad.onnx` (for comparison only); speech segments (samples)
  from the wheel's own `get_speech_timestamps` for several configurations; and the events of
  the wheel's own `VADIterator` over the clip.

The Silero code run here is the wheel's `silero_vad/utils_vad.py`, unmodified. It imports torch,
which is not installable here (PyPI's torch is the multi-GB CUDA build; the CPU build's index
is not reachable), so a minimal numpy-backed `torch` module (below, `_install_torch_shim`)
provides the handful of tensor operations that `OnnxWrapper`, `get_speech_timestamps` and
`VADIterator` use (zeros, cat, pad, from_numpy, indexing); the arithmetic of the
post-processing is plain Python in the wheel and does not touch it. The one other adaptation: the
OpenVINO export has no `sr` input, so the session wrapper drops feeds the model does not declare.

Run (a venv with onnxruntime, numpy, scipy, packaging and the silero-vad wheel installed with
--no-deps; see docs/vad.md):
    .venv-vad/bin/python scripts/make_vad_fixtures.py
"""

import hashlib
import json
import os
import sys
import types
import wave
import warnings

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RATE = 16000


def _install_torch_shim():
    """A numpy stand-in for the few torch calls of silero_vad/utils_vad.py and model.py."""

    class Tensor(np.ndarray):
        def __new__(cls, data=()):
            return np.asarray(data, dtype=np.float32).view(cls)

        def dim(self):
            return self.ndim

        def unsqueeze(self, d):
            return np.expand_dims(self, d)

        def numpy(self):
            return np.asarray(self)

        def float(self):
            return self.astype(np.float32)

        def cpu(self):
            return self

    def zeros(*shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return np.zeros(shape, dtype=np.float32).view(Tensor)

    def cat(xs, dim=0):
        return np.concatenate([np.asarray(x, dtype=np.float32) for x in xs], axis=dim).view(Tensor)

    def pad(x, pads, mode="constant", value=0.0):
        assert mode == "constant" and len(pads) == 2
        widths = [(0, 0)] * (x.ndim - 1) + [(int(pads[0]), int(pads[1]))]
        return np.pad(np.asarray(x), widths, mode="constant", constant_values=value).view(Tensor)

    class no_grad:
        def __call__(self, f):
            return f

    torch = types.ModuleType("torch")
    torch.Tensor = Tensor
    torch.zeros = zeros
    torch.cat = cat
    torch.from_numpy = lambda a: np.asarray(a).view(Tensor)
    torch.is_tensor = lambda x: isinstance(x, Tensor)
    torch.no_grad = no_grad
    torch.device = lambda name: name
    torch.set_num_threads = lambda n: None
    torch.nn = types.ModuleType("torch.nn")
    torch.nn.functional = types.ModuleType("torch.nn.functional")
    torch.nn.functional.pad = pad
    sys.modules["torch"] = torch
    sys.modules["torch.nn"] = torch.nn
    sys.modules["torch.nn.functional"] = torch.nn.functional
    return torch


torch = _install_torch_shim()
import silero_vad  # noqa: E402  (after the shim)
from silero_vad import utils_vad  # noqa: E402


class Wrapper(utils_vad.OnnxWrapper):
    """The wheel's OnnxWrapper; feeds the model does not declare (`sr`) are dropped."""

    def __init__(self, path):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            super().__init__(path, force_onnx_cpu=True)
        session = self.session
        names = {i.name for i in session.get_inputs()}

        class Session:
            def run(self, outputs, feeds):
                return session.run(outputs, {k: v for k, v in feeds.items() if k in names})

        self.session = Session()


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def read_wav_int16(path):
    with wave.open(path) as w:
        assert w.getsampwidth() == 2 and w.getnchannels() == 1, path
        rate = w.getframerate()
        x = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    return x.astype(np.float64) / 32768.0, rate


def write_wav_int16(path, x):
    q = np.clip(np.round(x * 32768.0), -32768, 32767).astype("<i2")
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(RATE)
        w.writeframes(q.tobytes())


def make_mix():
    """The test clip, 16 kHz float64 before quantisation, and its parts (seconds) for the record."""
    from scipy.signal import resample_poly

    rng = np.random.default_rng(36)
    clips = {}
    for name in ["fox", "goodnight", "news", "sleep"]:
        x, rate = read_wav_int16(os.path.join(ROOT, "fixtures", "speech", name + ".wav"))
        assert rate == 22050
        clips[name] = resample_poly(x, 320, 441)

    def silence(s):
        return np.zeros(int(s * RATE))

    def noise(s, dbfs):
        return rng.standard_normal(int(s * RATE)) * 10 ** (dbfs / 20)

    def rms(x):
        return np.sqrt(np.mean(x**2))

    noisy_news = clips["news"] + rng.standard_normal(len(clips["news"])) * rms(clips["news"]) / 10 ** (10 / 20)
    parts = [
        ("silence", silence(0.6)),
        ("fox", clips["fox"]),
        ("noise -60 dBFS", noise(1.2, -60)),
        ("goodnight", clips["goodnight"]),
        ("silence", silence(0.15)),
        ("news at 10 dB SNR", noisy_news),
        ("noise burst -30 dBFS", noise(0.4, -30)),
        ("silence", silence(1.6)),
        ("sleep", clips["sleep"] * 0.5),
        ("silence", silence(0.5)),
    ]
    x = np.concatenate([p for _, p in parts])
    layout, t = [], 0.0
    for name, p in parts:
        layout.append({"part": name, "start_s": round(t, 4), "end_s": round(t + len(p) / RATE, 4)})
        t += len(p) / RATE
    return x, layout


# The post-processing configurations checked (keyword arguments of get_speech_timestamps).
CONFIGS = {
    "default": {},
    "threshold_0.3": {"threshold": 0.3},
    "threshold_0.7_silence_300_pad_100": {"threshold": 0.7, "min_silence_duration_ms": 300, "speech_pad_ms": 100},
    "max_speech_2s": {"max_speech_duration_s": 2.0},
    "max_speech_2s_last_silence": {"max_speech_duration_s": 2.0, "use_max_poss_sil_at_max_speech": False},
    "max_speech_1s_min_silence_at_max_40": {"max_speech_duration_s": 1.0, "min_silence_at_max_speech": 40},
    "min_speech_600_neg_0.2": {"min_speech_duration_ms": 600, "neg_threshold": 0.2},
    "min_silence_20_pad_60": {"min_silence_duration_ms": 20, "speech_pad_ms": 60},
}

ITERATOR_CONFIGS = {
    "default": {},
    "threshold_0.6_silence_300_pad_50": {"threshold": 0.6, "min_silence_duration_ms": 300, "speech_pad_ms": 50},
}


def main():
    out_dir = os.path.join(ROOT, "fixtures", "vad")
    os.makedirs(out_dir, exist_ok=True)
    mix, layout = make_mix()
    wav_path = os.path.join(out_dir, "mix_16k.wav")
    write_wav_int16(wav_path, mix)
    audio, rate = read_wav_int16(wav_path)  # exactly what cadence's reader returns: int16 / 32768
    assert rate == RATE
    audio = torch.Tensor(audio.astype(np.float32))

    model_rel = "media/models/silero_vad_openvino_16k.onnx"
    model_path = os.path.join(ROOT, model_rel)
    model = Wrapper(model_path)
    model.reset_states()
    chunks = (len(audio) + 511) // 512
    probs = []
    for i in range(chunks):
        chunk = audio[i * 512 : (i + 1) * 512]
        if len(chunk) < 512:  # as get_speech_timestamps does
            chunk = torch.nn.functional.pad(chunk, (0, 512 - len(chunk)))
        probs.append(model(chunk, RATE).item())

    segments = {}
    for name, kw in CONFIGS.items():
        ts = utils_vad.get_speech_timestamps(audio, model, sampling_rate=RATE, **kw)
        segments[name] = {"params": kw, "segments": [[int(s["start"]), int(s["end"])] for s in ts]}

    # Post-processing alone, from the probabilities (the same code get_speech_timestamps calls).
    assert utils_vad.get_speech_timestamps_from_probs(probs, audio_length_samples=len(audio)) == [
        {"start": s, "end": e} for s, e in segments["default"]["segments"]
    ]

    iterators = {}
    for name, kw in ITERATOR_CONFIGS.items():
        it = utils_vad.VADIterator(model, sampling_rate=RATE, **kw)
        events = []
        for i in range(len(audio) // 512):  # whole chunks only, as the wheel's streaming example
            ev = it(audio[i * 512 : (i + 1) * 512])
            if ev:
                (kind, sample), = ev.items()
                events.append({"chunk": i, kind: int(sample)})
        iterators[name] = {"params": kw, "events": events}

    # The wheel's default model (opset 16, with `If` nodes), for comparison only.
    default_model = os.path.join(os.path.dirname(silero_vad.__file__), "data", "silero_vad.onnx")
    ref = Wrapper(default_model)
    ref.reset_states()
    probs_default = [ref(audio[i * 512 : (i + 1) * 512] if (i + 1) * 512 <= len(audio)
                         else torch.nn.functional.pad(audio[i * 512 :], (0, (i + 1) * 512 - len(audio))),
                         RATE).item() for i in range(chunks)]
    seg_default = utils_vad.get_speech_timestamps(audio, ref, sampling_rate=RATE)

    import onnxruntime

    doc = {
        "generator": "scripts/make_vad_fixtures.py",
        "silero_vad": silero_vad.__version__,
        "onnxruntime": onnxruntime.__version__,
        "numpy": np.__version__,
        "model": model_rel,
        "model_sha256": sha256(model_path),
        "wav": "fixtures/vad/mix_16k.wav",
        "wav_sha256": sha256(wav_path),
        "samples": int(len(audio)),
        "sample_rate": RATE,
        "chunk_samples": 512,
        "layout": layout,
        "probabilities": probs,
        "segments": segments,
        "iterator": iterators,
        "default_model": {
            "file": "silero_vad/data/silero_vad.onnx (wheel, not committed)",
            "sha256": sha256(default_model),
            "probabilities": probs_default,
            "segments": [[int(s["start"]), int(s["end"])] for s in seg_default],
        },
    }
    with open(os.path.join(out_dir, "silero_reference.json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    diff = max(abs(a - b) for a, b in zip(probs, probs_default))
    print(f"{chunks} chunks; {len(segments['default']['segments'])} default segments; "
          f"openvino vs default model: max |dp| = {diff:.2e}, segments equal: "
          f"{segments['default']['segments'] == doc['default_model']['segments']}")


if __name__ == "__main__":
    main()
