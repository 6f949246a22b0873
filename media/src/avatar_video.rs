//! Avatar videos: an H.264 MP4 read as RGB frames for a video avatar (`cadence render --avatar
//! clip.mp4`). The container is checked first, from its boxes alone (a video track, H.264, even
//! sides, a constant frame rate, the number of frames), so that a clip cadence cannot use is
//! refused before anything is decoded; then the frames are decoded one at a time (OpenH264, via
//! [`Mp4Reader::for_each_video_frame`]) and converted to RGB, so memory holds one decoded frame.

use std::path::Path;

use mp4_atom::Codec;

use crate::demux::Mp4Reader;
use crate::error::{MediaError, Result};
use crate::image::{RgbImage, MIN_SIDE};

/// What the container says about an avatar video, checked.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AvatarVideoInfo {
    pub width: u32,
    pub height: u32,
    /// Video samples (frames) in the track.
    pub frames: usize,
    /// Frames per second, from the one sample duration of the track.
    pub fps: f64,
}

/// Reads and checks an avatar video's container: a video track in H.264 (`avc1`), each side
/// even and in 64..=3840 (the output frame's limits), at least one sample, and one sample
/// duration for every frame (a variable frame rate is refused with the rates found: cadence
/// shows one avatar frame per output frame, so a clip's own timing could not be kept).
pub fn avatar_video_info(path: impl AsRef<Path>) -> Result<AvatarVideoInfo> {
    let path = path.as_ref();
    let err = |detail: String| MediaError::Mp4 { path: path.display().to_string(), detail };
    let reader = Mp4Reader::open(path)?;
    let trak = reader
        .moov()
        .trak
        .iter()
        .find(|t| t.mdia.hdlr.handler == (*b"vide").into())
        .ok_or_else(|| err("no video track: an avatar video needs H.264 video".into()))?;
    let (width, height) = match trak.mdia.minf.stbl.stsd.codecs.first() {
        Some(Codec::Avc1(a)) => (a.visual.width as u32, a.visual.height as u32),
        Some(other) => return Err(err(format!("video codec {other:?} is not H.264 (avc1)"))),
        None => return Err(err("the video track has no sample description".into())),
    };
    check_sides(width, height).map_err(err)?;
    reader.check_h264_decodable(trak).map_err(err)?;
    let samples = reader.track_samples(trak)?;
    let durations: Vec<u32> = samples.samples.iter().map(|s| s.duration).collect();
    let fps = constant_rate(&durations, samples.timescale).map_err(err)?;
    Ok(AvatarVideoInfo { width, height, frames: durations.len(), fps })
}

fn check_sides(w: u32, h: u32) -> std::result::Result<(), String> {
    if !w.is_multiple_of(2) || !h.is_multiple_of(2) {
        return Err(format!(
            "the video is {w}x{h}: H.264 in 4:2:0 needs an even width and height (crop or pad it by one pixel)"
        ));
    }
    if w < MIN_SIDE || h < MIN_SIDE {
        return Err(format!("the video is {w}x{h}: each side must be at least {MIN_SIDE} pixels"));
    }
    crate::video::check_frame_size(w, h).map_err(|e| format!("the video is {e}"))
}

/// The frame rate of samples of `durations` (in units of 1/`timescale` s): there must be at
/// least one sample, and every duration must be the same; otherwise the error lists the rates
/// found (at most five, each with its number of frames).
pub fn constant_rate(durations: &[u32], timescale: u32) -> std::result::Result<f64, String> {
    let Some(&first) = durations.first() else {
        return Err("the video track has no frames".into());
    };
    let rate = |d: u32| if d == 0 { f64::INFINITY } else { timescale as f64 / d as f64 };
    if durations.iter().all(|&d| d == first) {
        if first == 0 || timescale == 0 {
            return Err("the video's frames have no duration".into());
        }
        return Ok(rate(first));
    }
    let mut found: Vec<(u32, usize)> = Vec::new();
    for &d in durations {
        match found.iter_mut().find(|(x, _)| *x == d) {
            Some((_, n)) => *n += 1,
            None => found.push((d, 1)),
        }
    }
    let listed: Vec<String> = found
        .iter()
        .take(5)
        .map(|&(d, n)| format!("{:.3} fps ({n} frame{})", rate(d), if n == 1 { "" } else { "s" }))
        .collect();
    Err(format!(
        "variable frame rate: the frames' durations give {}{}; an avatar video needs one constant rate (re-encode it at a constant rate)",
        listed.join(", "),
        if found.len() > 5 { ", ..." } else { "" }
    ))
}

/// Decodes the avatar video's frames in order, handing each to `f` as RGB (BT.709, limited
/// range, what cadence's encoder writes; chroma of each 2x2 block used for its four pixels).
/// Every decoded frame must have the container's size. Returns the number of frames decoded;
/// none is an error ("no decodable video frame").
pub fn for_each_avatar_frame(
    path: impl AsRef<Path>,
    info: &AvatarVideoInfo,
    mut f: impl FnMut(usize, RgbImage) -> Result<()>,
) -> Result<usize> {
    let path = path.as_ref();
    let mut reader = Mp4Reader::open(path)?;
    let (w, h) = (info.width as usize, info.height as usize);
    let mut n = 0usize;
    let mut rgb = Vec::new();
    reader.for_each_video_frame(|nv12| {
        if nv12.len() != w * h * 3 / 2 {
            return Err(MediaError::Mp4 {
                path: path.display().to_string(),
                detail: format!(
                    "frame {n} decodes to {} bytes of NV12, not the {w}x{h} the container declares",
                    nv12.len()
                ),
            });
        }
        nv12_to_rgb(nv12, w, h, &mut rgb);
        let img = RgbImage::from_raw(w as u32, h as u32, std::mem::take(&mut rgb)).expect("w x h x 3 bytes");
        f(n, img)?;
        n += 1;
        Ok(())
    })?;
    Ok(n)
}

/// NV12 (BT.709, limited range) to interleaved RGB8. Written here because the `openh264`
/// crate's `write_rgb8` converts with BT.601, while cadence writes (and its compositor converts
/// back with) BT.709: the avatar's background must round-trip with the matrix it was encoded
/// with.
pub fn nv12_to_rgb(nv12: &[u8], w: usize, h: usize, out: &mut Vec<u8>) {
    assert!(w.is_multiple_of(2) && h.is_multiple_of(2) && nv12.len() == w * h * 3 / 2, "NV12 of {w}x{h}");
    const KR: f32 = 0.2126;
    const KB: f32 = 0.0722;
    const KG: f32 = 1.0 - KR - KB;
    let ys = 255.0 / 219.0;
    let cs = 255.0 / 224.0;
    let (rv, bu) = (cs * 2.0 * (1.0 - KR), cs * 2.0 * (1.0 - KB));
    let (gu, gv) = (-cs * 2.0 * (1.0 - KB) * KB / KG, -cs * 2.0 * (1.0 - KR) * KR / KG);
    let q = |v: f32| v.round().clamp(0.0, 255.0) as u8;
    out.clear();
    out.resize(w * h * 3, 0);
    let (y_plane, uv_plane) = nv12.split_at(w * h);
    for (row, px_row) in out.chunks_exact_mut(w * 3).enumerate() {
        let uv_row = &uv_plane[(row / 2) * w..(row / 2 + 1) * w];
        for (x, px) in px_row.chunks_exact_mut(3).enumerate() {
            let y = ys * (y_plane[row * w + x] as f32 - 16.0);
            let u = uv_row[x & !1] as f32 - 128.0;
            let v = uv_row[(x & !1) + 1] as f32 - 128.0;
            px[0] = q(y + rv * v);
            px[1] = q(y + gu * u + gv * v);
            px[2] = q(y + bu * u);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_rates_pass_and_variable_ones_list_the_rates() {
        assert_eq!(constant_rate(&[40, 40, 40], 1000), Ok(25.0));
        assert_eq!(constant_rate(&[1001; 4], 30000), Ok(30000.0 / 1001.0));
        let e = constant_rate(&[40, 40, 80, 40], 1000).unwrap_err();
        assert!(e.contains("25.000 fps (3 frames)") && e.contains("12.500 fps (1 frame)"), "{e}");
        assert!(constant_rate(&[], 1000).unwrap_err().contains("no frames"));
        assert!(constant_rate(&[0, 0], 1000).unwrap_err().contains("no duration"));
    }

    /// The inverse against an independent f64 forward conversion (BT.709 limited range): for a
    /// 2x2 block of one colour, RGB -> YUV (f64, rounded) -> RGB is within 1 of the start for
    /// colours inside the gamut's round trip.
    #[test]
    fn nv12_to_rgb_inverts_an_f64_bt709_forward_conversion() {
        let (kr, kb) = (0.2126f64, 0.0722f64);
        let kg = 1.0 - kr - kb;
        let mut worst = 0i32;
        for r in (0..=255).step_by(15) {
            for g in (0..=255).step_by(15) {
                for b in (0..=255).step_by(15) {
                    let (rf, gf, bf) = (r as f64 / 255.0, g as f64 / 255.0, b as f64 / 255.0);
                    let yy = kr * rf + kg * gf + kb * bf;
                    let pb = (bf - yy) / (2.0 * (1.0 - kb));
                    let pr = (rf - yy) / (2.0 * (1.0 - kr));
                    let y8 = (16.0 + 219.0 * yy).round() as u8;
                    let (u8_, v8) = ((128.0 + 224.0 * pb).round() as u8, (128.0 + 224.0 * pr).round() as u8);
                    let nv12 = [y8, y8, y8, y8, u8_, v8];
                    let mut out = Vec::new();
                    nv12_to_rgb(&nv12, 2, 2, &mut out);
                    for px in out.chunks_exact(3) {
                        for (got, want) in px.iter().zip([r, g, b]) {
                            worst = worst.max((*got as i32 - want).abs());
                        }
                    }
                }
            }
        }
        // 8-bit quantisation of Y, U, V (each off by up to half a step, scaled by the inverse
        // matrix's largest gain 2.11 x 255/224) bounds the error at 2.
        assert!(worst <= 2, "worst channel error {worst}");
    }

    #[test]
    fn each_chroma_sample_serves_its_2x2_block() {
        // Two blocks: grey on the left, pure chroma offset on the right.
        let nv12 = [126, 126, 126, 126, 126, 126, 126, 126, 128, 128, 128, 240];
        let mut out = Vec::new();
        nv12_to_rgb(&nv12, 4, 2, &mut out);
        for row in 0..2 {
            let px = |x: usize| &out[(row * 4 + x) * 3..(row * 4 + x) * 3 + 3];
            assert_eq!(px(0), px(1));
            assert_eq!(px(0)[0], px(0)[2], "grey");
            assert!(px(2)[0] > px(2)[2] + 100, "red-shifted block: {:?}", px(2));
        }
    }
}
