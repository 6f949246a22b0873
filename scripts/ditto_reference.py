#!/usr/bin/env python3
"""Independent PyTorch references for cadence's Ditto networks (engines/src/ditto/).

Written from the module descriptions of LivePortrait (src/modules/{spade_generator,warping_network,
dense_motion,util}.py) and Ditto (core/models/modules/stitching_network.py), not copied: the
attribute names are the published ones so that `state_dict()` has the published keys. Each network
is built at a reduced size with seeded weights (BatchNorm running statistics and spectral-norm
vectors set to non-trivial values), and its state dict, inputs and outputs are written to
fixtures/ditto/. The Rust tests (engines/tests/ditto.rs) load the weights by their original names
and compare.

Run once (needs torch and safetensors):
    python3 scripts/ditto_reference.py fixtures/ditto
"""

import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file

torch.manual_seed(1234)
torch.set_num_threads(1)


# ---------------------------------------------------------------- stitching (Ditto)
class Stitching(nn.Module):
    def __init__(self, sizes):
        super().__init__()
        layers = []
        for i in range(len(sizes) - 1):
            layers.append(nn.Linear(sizes[i], sizes[i + 1]))
            if i + 2 < len(sizes):
                layers.append(nn.ReLU())
        self.mlp = nn.Sequential(*layers)

    def forward(self, kp_s, kp_d):
        b, k = kp_s.shape[:2]
        delta = self.mlp(torch.cat([kp_s.reshape(b, -1), kp_d.reshape(b, -1)], 1))
        out = kp_d + delta[:, : 3 * k].reshape(b, k, 3)
        shift = torch.zeros(b, 1, 3)
        shift[:, 0, :2] = delta[:, 3 * k : 3 * k + 2]
        return out + shift


# ---------------------------------------------------------------- SPADE decoder (LivePortrait)
class Spade(nn.Module):
    def __init__(self, channels, label, hidden):
        super().__init__()
        self.param_free_norm = nn.InstanceNorm2d(channels, affine=False)
        self.mlp_shared = nn.Sequential(nn.Conv2d(label, hidden, 3, padding=1), nn.ReLU())
        self.mlp_gamma = nn.Conv2d(hidden, channels, 3, padding=1)
        self.mlp_beta = nn.Conv2d(hidden, channels, 3, padding=1)

    def forward(self, x, seg):
        seg = F.interpolate(seg, size=x.shape[2:], mode="nearest")
        a = self.mlp_shared(seg)
        return self.param_free_norm(x) * (1 + self.mlp_gamma(a)) + self.mlp_beta(a)


class SpadeBlock(nn.Module):
    def __init__(self, cin, cout, label, hidden):
        super().__init__()
        mid = min(cin, cout)
        self.learned = cin != cout
        sn = nn.utils.spectral_norm
        self.conv_0 = sn(nn.Conv2d(cin, mid, 3, padding=1))
        self.conv_1 = sn(nn.Conv2d(mid, cout, 3, padding=1))
        self.norm_0 = Spade(cin, label, hidden)
        self.norm_1 = Spade(mid, label, hidden)
        if self.learned:
            self.conv_s = sn(nn.Conv2d(cin, cout, 1, bias=False))
            self.norm_s = Spade(cin, label, hidden)

    def forward(self, x, seg):
        s = self.conv_s(self.norm_s(x, seg)) if self.learned else x
        h = self.conv_0(F.leaky_relu(self.norm_0(x, seg), 0.2))
        h = self.conv_1(F.leaky_relu(self.norm_1(h, seg), 0.2))
        return s + h


class Decoder(nn.Module):
    def __init__(self, c, out, hidden):
        super().__init__()
        for i in range(6):
            setattr(self, f"G_middle_{i}", SpadeBlock(2 * c, 2 * c, c, hidden))
        self.fc = nn.Conv2d(c, 2 * c, 3, padding=1)
        self.up_0 = SpadeBlock(2 * c, c, c, hidden)
        self.up_1 = SpadeBlock(c, out, c, hidden)
        self.conv_img = nn.Sequential(nn.Conv2d(out, 12, 3, padding=1), nn.PixelShuffle(2))

    def forward(self, feature):
        x = self.fc(feature)
        for i in range(6):
            x = getattr(self, f"G_middle_{i}")(x, feature)
        x = self.up_0(F.interpolate(x, scale_factor=2), feature)
        x = self.up_1(F.interpolate(x, scale_factor=2), feature)
        return torch.sigmoid(self.conv_img(F.leaky_relu(x, 0.2)))


# ---------------------------------------------------------------- warping network (LivePortrait)
class ConvBn3d(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv3d(cin, cout, 3, padding=1)
        self.norm = nn.BatchNorm3d(cout)


class Down(ConvBn3d):
    def forward(self, x):
        return F.avg_pool3d(F.relu(self.norm(self.conv(x))), (1, 2, 2))


class Up(ConvBn3d):
    def forward(self, x):
        return F.relu(self.norm(self.conv(F.interpolate(x, scale_factor=(1, 2, 2)))))


class Hourglass(nn.Module):
    def __init__(self, be, fin, blocks, fmax):
        super().__init__()
        width = lambda i: min(fmax, be * 2**i)
        self.encoder = nn.Module()
        self.encoder.down_blocks = nn.ModuleList(
            [Down(fin if i == 0 else width(i), width(i + 1)) for i in range(blocks)]
        )
        self.decoder = nn.Module()
        self.decoder.up_blocks = nn.ModuleList(
            [Up((1 if i == blocks - 1 else 2) * width(i + 1), width(i)) for i in reversed(range(blocks))]
        )
        self.out_filters = be + fin
        self.decoder.conv = nn.Conv3d(self.out_filters, self.out_filters, 3, padding=1)
        self.decoder.norm = nn.BatchNorm3d(self.out_filters)

    def forward(self, x):
        skips = [x]
        for d in self.encoder.down_blocks:
            skips.append(d(skips[-1]))
        out = skips.pop()
        for u in self.decoder.up_blocks:
            out = torch.cat([u(out), skips.pop()], 1)
        return F.relu(self.decoder.norm(self.decoder.conv(out)))


def coordinate_grid(d, h, w):
    ax = lambda n: 2 * (torch.arange(n, dtype=torch.float32) / (n - 1)) - 1
    z, y, x = torch.meshgrid(ax(d), ax(h), ax(w), indexing="ij")
    return torch.stack([x, y, z], -1)  # (d, h, w, 3): x, y, z


class DenseMotion(nn.Module):
    def __init__(self, kp, feat, depth, compress, be, fmax, blocks):
        super().__init__()
        self.kp = kp
        self.hourglass = Hourglass(be, (kp + 1) * (compress + 1), blocks, fmax)
        self.mask = nn.Conv3d(self.hourglass.out_filters, kp + 1, 7, padding=3)
        self.compress = nn.Conv3d(feat, compress, 1)
        self.norm = nn.BatchNorm3d(compress)
        self.occlusion = nn.Conv2d(self.hourglass.out_filters * depth, 1, 7, padding=3)

    def forward(self, feature, kp_d, kp_s):
        f = F.relu(self.norm(self.compress(feature)))
        b, c, d, h, w = f.shape
        g = coordinate_grid(d, h, w)
        moved = g[None, None] - kp_d[:, :, None, None, None, :] + kp_s[:, :, None, None, None, :]
        grids = torch.cat([g[None, None].expand(b, 1, d, h, w, 3), moved], 1)  # (b, k+1, d, h, w, 3)
        n = self.kp + 1
        sampled = F.grid_sample(
            f[:, None].expand(b, n, c, d, h, w).reshape(b * n, c, d, h, w),
            grids.reshape(b * n, d, h, w, 3),
            mode="bilinear",
            padding_mode="zeros",
            align_corners=False,
        ).reshape(b, n, c, d, h, w)

        def gauss(kp):
            diff = g[None, None] - kp[:, :, None, None, None, :]
            return torch.exp(-0.5 * (diff**2).sum(-1) / 0.01)

        heat = torch.cat([torch.zeros(b, 1, d, h, w), gauss(kp_d) - gauss(kp_s)], 1)
        x = torch.cat([heat[:, :, None], sampled], 2).reshape(b, -1, d, h, w)
        pred = self.hourglass(x)
        mask = F.softmax(self.mask(pred), 1)
        deformation = (grids * mask[..., None]).sum(1)  # (b, d, h, w, 3)
        occlusion = torch.sigmoid(self.occlusion(pred.reshape(b, -1, h, w)))
        return deformation, occlusion


class SameBlock2d(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)
        self.norm = nn.BatchNorm2d(cout)

    def forward(self, x):
        return F.leaky_relu(self.norm(self.conv(x)), 0.01)


class Warping(nn.Module):
    def __init__(self, kp, feat, depth, compress, be, fmax, blocks, out):
        super().__init__()
        self.dense_motion_network = DenseMotion(kp, feat, depth, compress, be, fmax, blocks)
        self.third = SameBlock2d(feat * depth, out)
        self.fourth = nn.Conv2d(out, out, 1)

    def forward(self, feature_3d, kp_source, kp_driving):  # Ditto's argument order
        deformation, occlusion = self.dense_motion_network(feature_3d, kp_driving, kp_source)
        warped = F.grid_sample(feature_3d, deformation, mode="bilinear", padding_mode="zeros", align_corners=False)
        b, c, d, h, w = warped.shape
        return self.fourth(self.third(warped.reshape(b, c * d, h, w))) * occlusion


# ---------------------------------------------------------------- appearance extractor (LivePortrait)
class ConvBn2d(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)
        self.norm = nn.BatchNorm2d(cout)


class Res3d(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1 = nn.Conv3d(c, c, 3, padding=1)
        self.conv2 = nn.Conv3d(c, c, 3, padding=1)
        self.norm1 = nn.BatchNorm3d(c)
        self.norm2 = nn.BatchNorm3d(c)

    def forward(self, x):
        h = self.conv1(F.relu(self.norm1(x)))
        return self.conv2(F.relu(self.norm2(h))) + x


class Appearance(nn.Module):
    def __init__(self, image, be, downs, fmax, rc, rd, res):
        super().__init__()
        self.rc, self.rd = rc, rd
        self.first = ConvBn2d(image, be)
        width = lambda i: min(fmax, be * 2**i)
        self.down_blocks = nn.ModuleList([ConvBn2d(width(i), width(i + 1)) for i in range(downs)])
        self.second = nn.Conv2d(width(downs), fmax, 1)
        self.resblocks_3d = nn.Sequential()
        for i in range(res):
            self.resblocks_3d.add_module(f"3dr{i}", Res3d(rc))

    def forward(self, img):
        x = F.relu(self.first.norm(self.first.conv(img)))
        for d in self.down_blocks:
            x = F.avg_pool2d(F.relu(d.norm(d.conv(x))), 2)
        x = self.second(x)
        b, c, h, w = x.shape
        return self.resblocks_3d(x.reshape(b, self.rc, self.rd, h, w))


# ---------------------------------------------------------------- motion extractor (ConvNeXtV2, LivePortrait)
class LN(nn.Module):
    """LayerNorm over channels, eps 1e-6, for NCHW (channels_first) or NHWC input."""

    def __init__(self, c, channels_first):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(c))
        self.bias = nn.Parameter(torch.zeros(c))
        self.cf = channels_first

    def forward(self, x):
        if self.cf:
            return F.layer_norm(x.permute(0, 2, 3, 1), x.shape[1:2], self.weight, self.bias, 1e-6).permute(0, 3, 1, 2)
        return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, 1e-6)


class NextBlock(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.dwconv = nn.Conv2d(d, d, 7, padding=3, groups=d)
        self.norm = LN(d, False)
        self.pwconv1 = nn.Linear(d, 4 * d)
        self.grn = nn.Module()
        self.grn.gamma = nn.Parameter(torch.zeros(1, 1, 1, 4 * d))
        self.grn.beta = nn.Parameter(torch.zeros(1, 1, 1, 4 * d))
        self.pwconv2 = nn.Linear(4 * d, d)

    def forward(self, x):
        h = self.dwconv(x).permute(0, 2, 3, 1)
        h = F.gelu(self.pwconv1(self.norm(h)))
        g = torch.sqrt((h * h).sum(dim=(1, 2), keepdim=True))
        h = self.grn.gamma * (h * (g / (g.mean(dim=-1, keepdim=True) + 1e-6))) + self.grn.beta + h
        return x + self.pwconv2(h).permute(0, 3, 1, 2)


class Motion(nn.Module):
    def __init__(self, depths, dims, kp, bins):
        super().__init__()
        det = nn.Module()
        det.downsample_layers = nn.ModuleList([nn.Sequential(nn.Conv2d(3, dims[0], 4, stride=4), LN(dims[0], True))])
        for i in range(3):
            det.downsample_layers.append(nn.Sequential(LN(dims[i], True), nn.Conv2d(dims[i], dims[i + 1], 2, stride=2)))
        det.stages = nn.ModuleList([nn.Sequential(*[NextBlock(dims[i]) for _ in range(depths[i])]) for i in range(4)])
        det.norm = nn.LayerNorm(dims[-1], eps=1e-6)
        for name, n in [("kp", 3 * kp), ("scale", 1), ("pitch", bins), ("yaw", bins), ("roll", bins), ("t", 3), ("exp", 3 * kp)]:
            setattr(det, f"fc_{name}", nn.Linear(dims[-1], n))
        self.detector = det

    def forward(self, x):
        d = self.detector
        for i in range(4):
            x = d.stages[i](d.downsample_layers[i](x))
        x = d.norm(x.mean([-2, -1]))
        return {k: getattr(d, f"fc_{k}")(x) for k in ["pitch", "yaw", "roll", "t", "exp", "scale", "kp"]}


# ---------------------------------------------------------------- weights and fixtures
def randomize(model):
    """Non-trivial eval state: BN running statistics and affine parameters away from (0, 1),
    spectral-norm vectors from a few power iterations (what training leaves behind)."""
    for m in model.modules():
        if isinstance(m, (nn.BatchNorm2d, nn.BatchNorm3d)):
            with torch.no_grad():
                m.running_mean.uniform_(-0.3, 0.3)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
            m.num_batches_tracked.fill_(7)
    model.train()
    has_sn = any(k.endswith("weight_u") for k in model.state_dict())
    if has_sn:
        # Each call of a spectral-norm hook in training mode does one power iteration of u, v.
        with torch.no_grad():
            for _ in range(3):
                for m in model.modules():
                    if hasattr(m, "weight_orig"):
                        for hook in m._forward_pre_hooks.values():
                            hook(m, None)
    model.eval()
    return model


def save(out_dir, name, model, inputs, outputs):
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(sd, os.path.join(out_dir, f"{name}_weights.safetensors"))
    io = {**{f"in.{k}": v.contiguous() for k, v in inputs.items()}, **{f"out.{k}": v.contiguous() for k, v in outputs.items()}}
    save_file(io, os.path.join(out_dir, f"{name}_io.safetensors"))


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)

    # Stitching at its real size, saved the way Ditto's checkpoint is: {"retarget_shoulder":
    # {"module.mlp.0.weight": ...}} beside LivePortrait's other two retargeting MLPs.
    st = Stitching([126, 128, 128, 64, 65]).eval()
    kp_s = torch.rand(2, 21, 3) * 1.6 - 0.8
    kp_d = kp_s + 0.05 * torch.randn(2, 21, 3)
    with torch.no_grad():
        out = st(kp_s, kp_d)
    ck = {
        "retarget_shoulder": {f"module.{k}": v for k, v in st.state_dict().items()},
        "retarget_mouth": {"module.mlp.0.weight": torch.randn(128, 65)},
    }
    torch.save(ck, os.path.join(out_dir, "stitch.pth"))
    save_file({"in.kp_source": kp_s, "in.kp_driving": kp_d, "out.kp": out}, os.path.join(out_dir, "stitch_io.safetensors"))

    # SPADE decoder: label/feature channels 8 (real 256), out 4 (64), hidden 8 (128), 8x8 input.
    dec = randomize(Decoder(8, 4, 8))
    feature = torch.randn(1, 8, 8, 8)
    with torch.no_grad():
        img = dec(feature)
    save(out_dir, "spade", dec, {"feature": feature}, {"image": img})

    # Warping: 3 keypoints (21), feature 4x4 depth (32x16), compress 2 (4), hourglass widths
    # 4..16 over 3 blocks (32..1024 over 5), out 8 (256), 16x16 (64x64).
    wn = randomize(Warping(kp=3, feat=4, depth=4, compress=2, be=4, fmax=16, blocks=3, out=8))
    f3d = torch.randn(1, 4, 4, 16, 16)
    kp_s = torch.rand(1, 3, 3) * 1.6 - 0.8
    kp_d = kp_s + 0.15 * torch.randn(1, 3, 3)
    with torch.no_grad():
        out = wn(f3d, kp_s, kp_d)
        deformation, occlusion = wn.dense_motion_network(f3d, kp_d, kp_s)
    save(
        out_dir,
        "warp",
        wn,
        {"feature_3d": f3d, "kp_source": kp_s, "kp_driving": kp_d},
        {"out": out, "deformation": deformation, "occlusion": occlusion},
    )

    # Appearance extractor: widths 4..16 (64..512), reshape 4 x 4 (32 x 16), 2 resblocks (6),
    # 16x16 image (256x256).
    ap = randomize(Appearance(image=3, be=4, downs=2, fmax=16, rc=4, rd=4, res=2))
    img = torch.rand(1, 3, 16, 16)
    with torch.no_grad():
        vol = ap(img)
    save(out_dir, "appearance", ap, {"image": img}, {"feature_3d": vol})

    # Motion extractor: depths [1, 1, 2, 1] ([3, 3, 9, 3]), dims 8..32 (96..768), 3 keypoints
    # (21), 5 bins (66), 64x64 image (256x256). LayerNorm and GRN parameters randomised (GRN's
    # are zeros at init, which would hide it).
    me = Motion([1, 1, 2, 1], [8, 16, 24, 32], kp=3, bins=5).eval()
    with torch.no_grad():
        for k, v in me.named_parameters():
            if "grn" in k or "norm" in k or "downsample_layers.0.1" in k or k.endswith(".0.weight") and v.dim() == 1:
                v.uniform_(-0.5, 0.5) if "grn" in k else v.uniform_(0.5, 1.5) if k.endswith("weight") else v.uniform_(-0.2, 0.2)
    img = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        outs = me(img)
    save(out_dir, "motion", me, {"image": img}, outs)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fixtures/ditto")
