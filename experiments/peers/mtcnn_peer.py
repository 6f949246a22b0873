#!/usr/bin/env python3
"""facenet-pytorch peer of cadence's MTCNN face detector (`experiments/src/bin/faces_bench.rs`):
facenet-pytorch 2.6.0's `MTCNN()` (all defaults, CPU) timed on the same frames at the same number
of threads.

    /path/to/python experiments/peers/mtcnn_peer.py --facenet-path /tmp/fp --threads 2 --worker

--worker: prints one JSON line describing the setup (versions), then reads commands on standard
input until `quit` or end of input:
  `frame W H PATH`  reads W*H*3 raw RGB bytes (rows top to bottom) from PATH: the frame to time;
  `run`             one timed `mtcnn.detect(frame, landmarks=True)`, answered as
                    `{"seconds": s, "faces": [{"box": [x1, y1, x2, y2], "score": p}, ...]}`.
What is timed is the detection alone on an already decoded image: the frame is held as a numpy
uint8 HxWx3 array, the input `MTCNN.detect` documents (PIL images are converted to one, a tensor
is used as is). The conversion facenet-pytorch does itself (`torch.as_tensor`, to float) is part
of its detection and so of the time.

The facenet-pytorch wheel (`pip download --no-deps facenet-pytorch==2.6.0`, unzipped) is found on
--facenet-path, else the installed package. Without torch or facenet-pytorch it says what is
missing and exits with status 3.
"""

import argparse
import json
import platform
import sys
import time

NO_PEER_EXIT = 3


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--facenet-path", help="directory holding the unpacked facenet_pytorch package")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--worker", action="store_true", required=True)
    a = ap.parse_args()
    if a.facenet_path:
        sys.path.insert(0, a.facenet_path)
    try:
        import numpy as np
        import torch
    except ImportError as e:
        print(f"mtcnn_peer: {sys.executable} lacks {e.name} (needs torch, torchvision, numpy)", file=sys.stderr)
        sys.exit(NO_PEER_EXIT)
    try:
        import facenet_pytorch
        from facenet_pytorch import MTCNN
    except ImportError as e:
        print(
            f"mtcnn_peer: facenet-pytorch is not importable ({e}); unpack its 2.6.0 wheel "
            "(pip download --no-deps facenet-pytorch==2.6.0) and pass --facenet-path DIR",
            file=sys.stderr,
        )
        sys.exit(NO_PEER_EXIT)

    torch.set_num_threads(a.threads)
    torch.set_grad_enabled(False)
    mtcnn = MTCNN(device="cpu")
    version = getattr(facenet_pytorch, "__version__", None)
    if version is None:
        from importlib import metadata

        try:
            version = metadata.version("facenet-pytorch")
        except metadata.PackageNotFoundError:
            version = "unknown (" + facenet_pytorch.__file__ + ")"
    info = {
        "torch": torch.__version__,
        "facenet_pytorch": version,
        "facenet_path": facenet_pytorch.__file__,
        "numpy": np.__version__,
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "python": platform.python_version(),
        "input": "numpy uint8 HxWx3",
    }
    print(json.dumps(info), flush=True)

    frame = None
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "quit":
            break
        if cmd[0] == "frame":
            w, h, path = int(cmd[1]), int(cmd[2]), " ".join(cmd[3:])
            with open(path, "rb") as f:
                frame = np.frombuffer(f.read(), dtype=np.uint8).reshape(h, w, 3).copy()
            print(json.dumps({"ok": True}), flush=True)
        elif cmd[0] == "run":
            t = time.perf_counter()
            boxes, probs, _points = mtcnn.detect(frame, landmarks=True)
            seconds = time.perf_counter() - t
            faces = []
            if boxes is not None:
                faces = [{"box": [float(v) for v in b], "score": float(p)} for b, p in zip(boxes, probs)]
            print(json.dumps({"seconds": seconds, "faces": faces}), flush=True)
        else:
            print(json.dumps({"error": f"unknown command {cmd[0]}"}), flush=True)


if __name__ == "__main__":
    main()
