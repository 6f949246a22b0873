#!/usr/bin/env python3
"""PyTorch peer of `cadence engine-bench`: the same networks, built with diffusers and
transformers from their configurations with random weights (nothing is downloaded), timed at
the same batch, thread count and input sizes.

    python3 experiments/peers/torch_peer.py --install          # local venv: experiments/peers/.venv
    experiments/peers/.venv/bin/python experiments/peers/torch_peer.py --model unet --batch 8 --runs 5
    ... --worker                                               # the protocol peer_bench drives

Models (full profile, as cadence's `engines/src/config.rs` checks them):
  unet     MuseTalk's UNet2DConditionModel (musetalk.json): in 8, out 4, blocks
           [320, 640, 1280, 1280], cross-attention 384, 8 heads; (B,8,32,32) + (B,50,384), t = 0
  taesd    AutoencoderTiny's decoder (madebyollin/taesd): (B,4,32,32) -> (B,3,256,256)
  sd-vae   AutoencoderKL decoder (sd-vae-ft-mse, [128, 256, 512, 512]) incl. post_quant_conv:
           (B,4,32,32) / 0.18215 -> (B,3,256,256)
  whisper  whisper-tiny's encoder (transformers WhisperEncoder, all hidden states) after the
           log-mel of 25.6 s of audio padded to a 30 s window (torch.stft, Slaney mel filters),
           as cadence's `bench_audio` times it

--worker: prints one JSON line describing the setup, then answers every `run` line on standard
input with one timed forward pass as `{"seconds": ...}`, until `quit` or end of input. Without
torch it prints how to install it and exits with status 3.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENV = HERE / ".venv"
PACKAGES = ["torch", "diffusers", "transformers", "safetensors"]
NO_TORCH_EXIT = 3
INSTALL_HINT = (
    "PyTorch is not installed for {python}.\n"
    "Create the peer's virtual environment (PyPI: torch, diffusers, transformers; a few GB):\n"
    "    python3 experiments/peers/torch_peer.py --install\n"
    "then run the peer with experiments/peers/.venv/bin/python (peer_bench: --python PATH "
    "or CADENCE_PEER_PYTHON)."
)


def install():
    """Creates experiments/peers/.venv (git-ignored) and installs the peer's packages from PyPI."""
    if not (VENV / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    py = str(VENV / "bin" / "python")
    subprocess.run([py, "-m", "pip", "install", "--upgrade", *PACKAGES], check=True)
    print(f"installed {', '.join(PACKAGES)} into {VENV}; run the peer with {py}")


def unet_model():
    from diffusers import UNet2DConditionModel

    return UNet2DConditionModel(
        sample_size=32,
        in_channels=8,
        out_channels=4,
        down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
        up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
        block_out_channels=(320, 640, 1280, 1280),
        layers_per_block=2,
        cross_attention_dim=384,
        attention_head_dim=8,
        norm_num_groups=32,
        norm_eps=1e-5,
        flip_sin_to_cos=True,
        freq_shift=0,
    )


def build(model, batch):
    """(callable doing one forward pass, description of the inputs)."""
    import torch

    g = torch.Generator().manual_seed(0)
    if model == "unet":
        net = unet_model().eval()
        x = torch.rand(batch, 8, 32, 32, generator=g) * 2 - 1
        audio = torch.rand(batch, 50, 384, generator=g) * 2 - 1
        t = torch.zeros(batch, dtype=torch.long)
        return (lambda: net(x, t, encoder_hidden_states=audio).sample), f"({batch},8,32,32) + ({batch},50,384)"
    if model == "taesd":
        from diffusers import AutoencoderTiny

        net = AutoencoderTiny().eval()
        z = torch.rand(batch, 4, 32, 32, generator=g) * 2 - 1
        return (lambda: net.decode(z).sample), f"({batch},4,32,32)"
    if model == "sd-vae":
        from diffusers import AutoencoderKL

        net = AutoencoderKL(
            in_channels=3,
            out_channels=3,
            down_block_types=("DownEncoderBlock2D",) * 4,
            up_block_types=("UpDecoderBlock2D",) * 4,
            block_out_channels=(128, 256, 512, 512),
            layers_per_block=2,
            latent_channels=4,
            norm_num_groups=32,
            sample_size=256,
        ).eval()
        net.encoder = None  # only the decoder is timed; frees its memory
        z = torch.rand(batch, 4, 32, 32, generator=g) * 2 - 1
        return (lambda: net.decode(z / 0.18215).sample), f"({batch},4,32,32)"
    if model == "whisper":
        return whisper_forward(), "25.6 s of 16 kHz audio, one 30 s window"
    raise SystemExit(f"unknown model {model!r}: unet, taesd, sd-vae or whisper")


def whisper_forward():
    import torch
    from transformers import WhisperConfig
    from transformers.audio_utils import mel_filter_bank
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    cfg = WhisperConfig(
        d_model=384,
        encoder_layers=4,
        encoder_attention_heads=6,
        encoder_ffn_dim=1536,
        num_mel_bins=80,
        max_source_positions=1500,
        activation_function="gelu",
    )
    enc = WhisperEncoder(cfg).eval()
    n = int(25.6 * 16000)
    samples = 0.3 * torch.sin(torch.arange(n, dtype=torch.float32) * 0.05)  # bench_audio's signal
    filters = torch.from_numpy(
        mel_filter_bank(
            num_frequency_bins=201,
            num_mel_filters=80,
            min_frequency=0.0,
            max_frequency=8000.0,
            sampling_rate=16000,
            norm="slaney",
            mel_scale="slaney",
        )
    ).float().T
    window = torch.hann_window(400)

    def run():
        # openai-whisper's log_mel_spectrogram of the signal padded to 30 s.
        x = torch.nn.functional.pad(samples, (0, 480000 - n))
        stft = torch.stft(x, 400, 160, window=window, return_complex=True)
        power = stft[..., :-1].abs() ** 2
        mel = torch.clamp(filters @ power, min=1e-10).log10()
        mel = (torch.maximum(mel, mel.max() - 8.0) + 4.0) / 4.0
        return enc(mel[None], output_hidden_states=True).hidden_states

    return run


def setup(args):
    try:
        import torch
    except ImportError:
        print(INSTALL_HINT.format(python=sys.executable), file=sys.stderr)
        sys.exit(NO_TORCH_EXIT)
    import diffusers
    import transformers

    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    forward, inputs = build(args.model, args.batch)
    info = {
        "model": args.model,
        "batch": args.batch,
        "inputs": inputs,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "diffusers": diffusers.__version__,
        "transformers": transformers.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "python": sys.version.split()[0],
    }

    def timed():
        with torch.inference_mode():
            t0 = time.perf_counter()
            forward()
            return time.perf_counter() - t0

    return info, timed


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--install", action="store_true", help="create experiments/peers/.venv with torch from PyPI")
    ap.add_argument("--model", choices=["unet", "taesd", "sd-vae", "whisper"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=5, help="timed runs after one warm-up (median printed)")
    ap.add_argument("--worker", action="store_true", help="answer `run` lines on standard input (peer_bench)")
    args = ap.parse_args()
    if args.install:
        install()
        return
    if args.model is None:
        ap.error("--model is required (or --install)")
    if args.batch < 1 or args.threads < 1 or args.runs < 1:
        ap.error("--batch, --threads and --runs must be positive")
    info, timed = setup(args)
    if args.worker:
        print(json.dumps(info), flush=True)
        for line in sys.stdin:
            cmd = line.strip()
            if cmd == "quit":
                break
            if cmd != "run":
                print(json.dumps({"error": f"unknown command {cmd!r}"}), flush=True)
                continue
            print(json.dumps({"seconds": timed()}), flush=True)
        return
    timed()
    times = [timed() for _ in range(args.runs)]
    med = statistics.median(times)
    frames = 25.6 * 25 if args.model == "whisper" else args.batch
    print(json.dumps({**info, "runs": args.runs, "median_s": med, "frames_per_s": frames / med}))


if __name__ == "__main__":
    main()
