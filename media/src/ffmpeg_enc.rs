//! libx264 and h264_nvenc through ffmpeg-next (feature `ffmpeg`). Only the encoder comes
//! from libavcodec; packets (Annex B) go to the same Rust muxer as OpenH264's.

use ffmpeg_next as ff;

use crate::error::{MediaError, Result};
use crate::mux::AccessUnitSink;
use crate::video::{split_annex_b, EncoderKind};

pub(crate) struct FfmpegEnc {
    enc: ff::encoder::video::Encoder,
    frame: ff::frame::Video,
    packet: ff::Packet,
    name: &'static str,
    width: usize,
    height: usize,
    pts: i64,
}

fn err(name: &str, detail: impl std::fmt::Display) -> MediaError {
    MediaError::Encode { encoder: name.to_string(), detail: detail.to_string() }
}

impl FfmpegEnc {
    pub fn new(kind: EncoderKind, width: u32, height: u32, fps: crate::video::FrameRate, bitrate: u32) -> Result<Self> {
        let name = match kind {
            EncoderKind::X264 => "libx264",
            EncoderKind::Nvenc => "h264_nvenc",
            EncoderKind::OpenH264 => unreachable!("openh264 does not go through ffmpeg"),
        };
        ff::init().map_err(|e| err(name, format!("libav* initialisation failed: {e}")))?;
        // Keep libav*'s errors and warnings on stderr, not x264's per-run statistics.
        ff::util::log::set_level(ff::util::log::Level::Warning);
        let codec = ff::encoder::find_by_name(name).ok_or_else(|| {
            MediaError::EncoderUnavailable(format!(
                "this system's libavcodec has no {name} encoder (Debian's is built with libx264 and nvenc)"
            ))
        })?;
        let mut video =
            ff::codec::context::Context::new_with_codec(codec).encoder().video().map_err(|e| err(name, e))?;
        video.set_width(width);
        video.set_height(height);
        video.set_format(ff::format::Pixel::NV12);
        video.set_time_base((fps.den as i32, fps.num as i32));
        video.set_frame_rate(Some((fps.num as i32, fps.den as i32)));
        video.set_gop(crate::video::idr_period(fps));
        // No B-frames: decode order = presentation order, so the muxer needs no ctts.
        video.set_max_b_frames(0);
        video.set_bit_rate(bitrate as usize);
        video.set_colorspace(ff::color::Space::BT709);
        video.set_color_range(ff::color::Range::MPEG);
        let mut opts = ff::Dictionary::new();
        match kind {
            EncoderKind::X264 => {
                opts.set("preset", "veryfast");
                opts.set("bf", "0");
            }
            _ => {
                opts.set("preset", "p4");
                opts.set("bf", "0");
            }
        }
        let enc = video.open_with(opts).map_err(|e| match kind {
            EncoderKind::Nvenc => MediaError::EncoderUnavailable(format!(
                "h264_nvenc could not be opened ({e}): it needs an NVIDIA GPU and the driver's \
                 libcuda.so.1 and libnvidia-encode.so.1; use --encoder openh264 or x264"
            )),
            _ => err(name, format!("could not be opened: {e}")),
        })?;
        Ok(FfmpegEnc {
            enc,
            frame: ff::frame::Video::new(ff::format::Pixel::NV12, width, height),
            packet: ff::Packet::empty(),
            name,
            width: width as usize,
            height: height as usize,
            pts: 0,
        })
    }

    fn drain(&mut self, mux: &mut dyn AccessUnitSink) -> Result<()> {
        loop {
            match self.enc.receive_packet(&mut self.packet) {
                Ok(()) => {
                    let data = self.packet.data().unwrap_or(&[]);
                    let nals = split_annex_b(data);
                    mux.push_access_unit(&nals, self.packet.is_key())?;
                }
                Err(ff::Error::Other { errno }) if errno == ff::util::error::EAGAIN => return Ok(()),
                Err(ff::Error::Eof) => return Ok(()),
                Err(e) => return Err(err(self.name, e)),
            }
        }
    }

    pub fn encode(&mut self, nv12: &[u8], mux: &mut dyn AccessUnitSink) -> Result<()> {
        let (w, h) = (self.width, self.height);
        // Copy row by row: libav* frames have padded strides.
        for plane in 0..2 {
            let rows = if plane == 0 { h } else { h / 2 };
            let src = if plane == 0 { &nv12[..w * h] } else { &nv12[w * h..] };
            let stride = self.frame.stride(plane);
            let dst = self.frame.data_mut(plane);
            for r in 0..rows {
                dst[r * stride..r * stride + w].copy_from_slice(&src[r * w..(r + 1) * w]);
            }
        }
        self.frame.set_pts(Some(self.pts));
        self.pts += 1;
        self.enc.send_frame(&self.frame).map_err(|e| err(self.name, e))?;
        self.drain(mux)
    }

    pub fn flush(&mut self, mux: &mut dyn AccessUnitSink) -> Result<()> {
        self.enc.send_eof().map_err(|e| err(self.name, e))?;
        self.drain(mux)
    }
}
