#!/usr/bin/env python3
"""Reference outputs of MTCNN's three networks for cadence's Rust implementation
(engines/src/mtcnn.rs), from facenet-pytorch's own PNet/RNet/ONet classes with their pretrained
weights (the wheel's facenet_pytorch/data/*.pt, the files committed in engines/models/mtcnn/).

What it writes (committed, read by engines/tests/mtcnn.rs; no test runs Python):
- fixtures/mtcnn/nets_reference.json: for each network, seeded random pixels (0..255) in NCHW
  order, the input the network sees ((pixel - 127.5) * 0.0078125, as facenet-pytorch's
  detect_face normalises them: exact in f32), and the network's outputs (float32 values written
  as Python floats, so exactly). P-Net runs on a 1x3x23x31 image (odd sizes: its pooling rounds
  up), R-Net on 2 crops of 24x24, O-Net on 2 crops of 48x48.
- fixtures/mtcnn/detect_reference.json: facenet-pytorch's `MTCNN().detect(img, landmarks=True)`
  (all defaults) on the frames `frames()` builds from the committed public-domain / CC0 images
  (fixtures/mtcnn/IMAGES.md) with exact pixel operations the Rust test repeats: the portrait,
  mirrored, halved (every second pixel), placed at an odd offset in a 1080x1920 grey frame, two
  portraits side by side, and a photograph without a face. Per frame: boxes, scores, landmarks.

Run (a git-ignored venv with torch, torchvision, numpy, requests, tqdm and the facenet-pytorch
wheel unpacked or installed with --no-deps; docs/faces.md):
    .venv-mtcnn/bin/python scripts/make_mtcnn_fixtures.py [path to the unpacked wheel]
"""

import hashlib
import json
import os
import sys

import numpy as np
import torch

if len(sys.argv) > 1:
    sys.path.insert(0, sys.argv[1])
from facenet_pytorch.models.mtcnn import ONet, PNet, RNet  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main():
    torch.set_grad_enabled(False)
    rng = np.random.default_rng(40)
    nets = {"pnet": (PNet(), (1, 3, 23, 31)), "rnet": (RNet(), (2, 3, 24, 24)), "onet": (ONet(), (2, 3, 48, 48))}
    out = {"generator": "scripts/make_mtcnn_fixtures.py", "torch": torch.__version__, "nets": {}}
    import facenet_pytorch

    data = os.path.join(os.path.dirname(facenet_pytorch.__file__), "data")
    for name, (net, shape) in nets.items():
        net.eval()
        # The weights facenet-pytorch loaded are the committed files.
        assert sha256(os.path.join(data, name + ".pt")) == sha256(os.path.join(ROOT, "engines/models/mtcnn", name + ".pt"))
        pixels = rng.integers(0, 256, size=shape).astype(np.float32)
        x = torch.from_numpy((pixels - 127.5) * 0.0078125)
        outputs = net(x)
        out["nets"][name] = {
            "shape": list(shape),
            "pixels": pixels.astype(np.uint8).ravel().tolist(),
            "outputs": [{"shape": list(o.shape), "values": [float(v) for v in o.numpy().ravel()]} for o in outputs],
        }
    path = os.path.join(ROOT, "fixtures/mtcnn/nets_reference.json")
    with open(path, "w") as f:
        json.dump(out, f)
    print("wrote", path)

    from facenet_pytorch import MTCNN

    mtcnn = MTCNN()
    det = {"generator": "scripts/make_mtcnn_fixtures.py", "torch": torch.__version__, "frames": {}}
    for name, img in frames().items():
        boxes, probs, points = mtcnn.detect(img, landmarks=True)
        faces = []
        if boxes is not None:
            for b, p, l in zip(boxes, probs, points):
                faces.append({"box": [float(v) for v in b], "score": float(p), "landmarks": [[float(v) for v in xy] for xy in l]})
        det["frames"][name] = {"size": [img.shape[1], img.shape[0]], "faces": faces}
        print(name, img.shape, [f["box"] for f in faces])
    path = os.path.join(ROOT, "fixtures/mtcnn/detect_reference.json")
    with open(path, "w") as f:
        json.dump(det, f, indent=1)
    print("wrote", path)


def read_png(name):
    from PIL import Image

    return np.asarray(Image.open(os.path.join(ROOT, "fixtures/mtcnn", name)).convert("RGB"))


def frames():
    """The test frames (HxWx3 uint8); engines/tests/mtcnn.rs builds the same ones."""
    face = read_png("astronaut.png")
    frame = np.full((1920, 1080, 3), 128, dtype=np.uint8)
    frame[1101 : 1101 + 512, 283 : 283 + 512] = face
    return {
        "portrait": face,
        "mirrored": face[:, ::-1].copy(),
        "halved": face[::2, ::2].copy(),
        "in a 1080x1920 frame": frame,
        "two faces": np.concatenate([face, face[:, ::-1]], axis=1),
        "no face": read_png("coffee.png"),
    }


if __name__ == "__main__":
    main()
