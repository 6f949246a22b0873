//! AAC-LC encoding of the audio track with the `fdk-aac` crate (Fraunhofer FDK AAC, whose C++
//! source `fdk-aac-sys` bundles and builds with `cc`: no system library needed), and decoding
//! of raw AAC access units for reading MP4s back ([`Decoder`]).

use fdk_aac::enc::{AudioObjectType, BitRate, ChannelMode, Encoder, EncoderParams, Transport};

use crate::audio::{AudioTrack, AAC_RATES};
use crate::error::{MediaError, Result};

/// What the MP4's `mp4a`/`esds` sample entry and the edit list need to know about an AAC-LC
/// stream: known as soon as the encoder is open, before any audio (a live stream's init segment
/// is written from it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AacConfig {
    pub sample_rate: u32,
    pub channels: u16,
    /// Index of `sample_rate` in the AAC sampling-frequency table.
    pub freq_index: u8,
    /// AudioSpecificConfig from the encoder.
    pub asc: Vec<u8>,
    /// Samples per channel in each access unit.
    pub frame_len: u32,
    /// Encoder delay (priming samples) at the start of the stream; an edit list skips it.
    pub delay: u32,
    pub bitrate: u32,
    /// The largest access unit the encoder can produce, in bytes (the `esds` decoding buffer
    /// size of a stream whose access units are not all known yet).
    pub max_au_bytes: u32,
}

/// An encoded AAC-LC stream: raw access units (no ADTS headers) plus what the `esds` needs.
#[derive(Debug, Clone)]
pub struct EncodedAac {
    pub config: AacConfig,
    /// Access units, each `config.frame_len` samples per channel.
    pub access_units: Vec<Vec<u8>>,
    /// Sample frames of real audio (without priming and padding).
    pub frames: u64,
}

fn err(detail: impl Into<String>) -> MediaError {
    MediaError::Encode { encoder: "fdk-aac".into(), detail: detail.into() }
}

/// Encodes the track to AAC-LC at a constant bit rate (see [`AacEncoder::new`]).
pub fn encode(track: &AudioTrack) -> Result<EncodedAac> {
    let mut enc = AacEncoder::new(track.sample_rate, track.channels)?;
    enc.push(&track.samples)?;
    let config = enc.config().clone();
    let frames = enc.frames();
    let mut access_units = enc.take_access_units();
    access_units.extend(enc.finish()?);
    Ok(EncodedAac { config, access_units, frames })
}

/// AAC-LC encoder fed in pieces (live audio): access units come out as soon as the encoder has
/// them. However the input is cut into pieces, the encoder sees the same calls (full frames, then
/// the tail, then silence), so the access units are byte-identical to a whole-track encode.
pub struct AacEncoder {
    enc: Encoder,
    config: AacConfig,
    /// Input not yet given to the encoder: fewer than one frame after each `push`.
    pending: Vec<i16>,
    out: Vec<u8>,
    ready: Vec<Vec<u8>>,
    /// Sample frames pushed.
    frames: u64,
    /// Access units produced so far (handed out or ready).
    produced: u64,
}

impl AacEncoder {
    /// An encoder at a constant bit rate: 32 kb/s per channel at 16 kHz, 64 kb/s per channel at
    /// 44.1/48 kHz. `sample_rate` must be an AAC rate, `channels` 1 or 2.
    pub fn new(sample_rate: u32, channels: u16) -> Result<Self> {
        let freq_index = AAC_RATES
            .iter()
            .position(|&r| r == sample_rate)
            .ok_or_else(|| err(format!("{sample_rate} Hz is not an AAC sample rate")))? as u8;
        let mode = match channels {
            1 => ChannelMode::Mono,
            2 => ChannelMode::Stereo,
            n => return Err(err(format!("{n} channels (1 or 2 supported)"))),
        };
        let per_channel = match sample_rate {
            r if r >= 44_100 => 64_000,
            r if r >= 32_000 => 48_000,
            r if r >= 16_000 => 32_000,
            _ => 16_000,
        };
        let bitrate = per_channel * channels as u32;
        let enc = Encoder::new(EncoderParams {
            bit_rate: BitRate::Cbr(bitrate),
            sample_rate,
            transport: Transport::Raw,
            channels: mode,
            audio_object_type: AudioObjectType::Mpeg4LowComplexity,
        })
        .map_err(|e| err(e.to_string()))?;
        let info = enc.info().map_err(|e| err(e.to_string()))?;
        let asc = info.confBuf[..(info.confSize as usize).min(info.confBuf.len())].to_vec();
        if info.frameLength == 0 || asc.len() < 2 {
            return Err(err("encoder reported no frame length or AudioSpecificConfig"));
        }
        let config = AacConfig {
            sample_rate,
            channels,
            freq_index,
            asc,
            frame_len: info.frameLength,
            delay: info.nDelay,
            bitrate,
            max_au_bytes: info.maxOutBufBytes,
        };
        let out = vec![0u8; (info.maxOutBufBytes as usize).max(8192)];
        Ok(AacEncoder { enc, config, pending: Vec::new(), out, ready: Vec::new(), frames: 0, produced: 0 })
    }

    pub fn config(&self) -> &AacConfig {
        &self.config
    }

    /// Sample frames pushed so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// Interleaved samples of one frame of input for the encoder.
    fn block(&self) -> usize {
        self.config.frame_len as usize * self.config.channels as usize
    }

    /// One encoder call; returns the samples it consumed.
    fn call(&mut self, input: &[i16]) -> Result<usize> {
        let r = self.enc.encode(input, &mut self.out).map_err(|e| err(e.to_string()))?;
        if r.output_size > 0 {
            self.ready.push(self.out[..r.output_size].to_vec());
            self.produced += 1;
        }
        Ok(r.input_consumed)
    }

    /// Encodes interleaved samples (whole sample frames); access units that complete are kept
    /// for [`take_access_units`](Self::take_access_units).
    pub fn push(&mut self, samples: &[i16]) -> Result<()> {
        let ch = self.config.channels as usize;
        if !samples.len().is_multiple_of(ch) {
            return Err(MediaError::InvalidInput(format!(
                "{} audio samples are not whole frames of {ch} channels",
                samples.len()
            )));
        }
        self.frames += (samples.len() / ch) as u64;
        self.pending.extend_from_slice(samples);
        let block = self.block();
        let mut start = 0;
        let pending = std::mem::take(&mut self.pending);
        while pending.len() - start >= block {
            let used = self.call(&pending[start..start + block])?;
            if used == 0 {
                return Err(err("encoder stopped taking input"));
            }
            start += used;
        }
        self.pending = pending;
        self.pending.drain(..start);
        Ok(())
    }

    /// The access units completed since the last call, in order.
    pub fn take_access_units(&mut self) -> Vec<Vec<u8>> {
        std::mem::take(&mut self.ready)
    }

    /// Ends the stream: encodes the last partial frame and flushes the encoder's delay; returns
    /// the access units not yet taken. The last one is padded with silence (an MP4 edit list
    /// or the stream's end trims it).
    pub fn finish(mut self) -> Result<Vec<Vec<u8>>> {
        let fl = self.config.frame_len as u64;
        // fdk-aac's Rust wrapper cannot signal end of stream (numInSamples = -1), so the tail
        // is flushed by feeding silence until every real sample has come out.
        let needed = (self.frames + self.config.delay as u64).div_ceil(fl);
        let zeros = vec![0i16; self.block()];
        let pending = std::mem::take(&mut self.pending);
        let mut start = 0;
        let mut calls = 0u64;
        while self.produced < needed {
            calls += 1;
            if calls > 4 * needed + 64 {
                return Err(err("encoder stopped producing output"));
            }
            if start < pending.len() {
                start += self.call(&pending[start..])?;
            } else {
                self.call(&zeros)?;
            }
        }
        Ok(self.ready)
    }
}

/// FDK AAC's decoder for raw access units (the MP4 sample format), with its PCM limiter off.
///
/// Written against `fdk-aac-sys` because the `fdk-aac` crate's decoder cannot set parameters:
/// by default FDK's PCM limiter and its energy-interpolation concealment each delay the output
/// (`outputDelay` reads 1264 samples at 16 kHz), which would shift the audio against the MP4's
/// edit list and hold back the tail. With the limiter off and noise-substitution concealment the
/// output has no delay beyond the codec's own, which the edit list accounts for.
pub struct Decoder {
    handle: fdk_aac_sys::HANDLE_AACDECODER,
    pcm: Vec<i16>,
}

fn dec_err(what: &str, code: fdk_aac_sys::AAC_DECODER_ERROR) -> MediaError {
    MediaError::Encode { encoder: "fdk-aac decoder".into(), detail: format!("{what} failed (error 0x{code:x})") }
}

impl Decoder {
    /// A decoder for the stream described by `asc` (its AudioSpecificConfig).
    pub fn new(asc: &[u8]) -> Result<Self> {
        // SAFETY: plain C API calls on a handle this struct owns; the config pointer and length
        // describe `asc`, which outlives the call.
        unsafe {
            let handle = fdk_aac_sys::aacDecoder_Open(fdk_aac_sys::TRANSPORT_TYPE_TT_MP4_RAW, 1);
            if handle.is_null() {
                return Err(dec_err("opening the decoder", 0));
            }
            let d = Self { handle, pcm: vec![0; 2048 * 8] };
            let mut ptr = asc.as_ptr() as *mut u8;
            let len = asc.len() as u32;
            let e = fdk_aac_sys::aacDecoder_ConfigRaw(d.handle, &mut ptr, &len);
            if e != 0 {
                return Err(dec_err("reading the AudioSpecificConfig", e));
            }
            for (param, value, what) in [
                (fdk_aac_sys::AACDEC_PARAM_AAC_PCM_LIMITER_ENABLE, 0, "switching the limiter off"),
                (fdk_aac_sys::AACDEC_PARAM_AAC_CONCEAL_METHOD, 1, "choosing concealment without delay"),
            ] {
                let e = fdk_aac_sys::aacDecoder_SetParam(d.handle, param, value);
                if e != 0 {
                    return Err(dec_err(what, e));
                }
            }
            Ok(d)
        }
    }

    /// Decodes one access unit; returns its interleaved samples.
    pub fn decode(&mut self, au: &[u8]) -> Result<&[i16]> {
        // SAFETY: the buffers passed are valid for the lengths given; the decoder copies the
        // input during Fill and writes at most `pcm.len()` samples.
        unsafe {
            let mut ptr = au.as_ptr() as *mut u8;
            let len = au.len() as u32;
            let mut left = len;
            let e = fdk_aac_sys::aacDecoder_Fill(self.handle, &mut ptr, &len, &mut left);
            if e != 0 {
                return Err(dec_err("filling the decoder", e));
            }
            if left != 0 {
                return Err(dec_err(&format!("taking the access unit ({left} of {len} bytes left)"), 0));
            }
            let e = fdk_aac_sys::aacDecoder_DecodeFrame(self.handle, self.pcm.as_mut_ptr(), self.pcm.len() as i32, 0);
            if e != 0 {
                return Err(dec_err("decoding an access unit", e));
            }
            let info = &*fdk_aac_sys::aacDecoder_GetStreamInfo(self.handle);
            let n = (info.frameSize.max(0) as usize * info.numChannels.max(0) as usize).min(self.pcm.len());
            Ok(&self.pcm[..n])
        }
    }

    /// Samples per channel by which the decoder delays its output beyond the codec's own delay.
    pub fn output_delay(&self) -> u32 {
        // SAFETY: as in `format`.
        unsafe { (*fdk_aac_sys::aacDecoder_GetStreamInfo(self.handle)).outputDelay }
    }

    /// Sample rate and channel count of the decoded stream (known after the first frame).
    pub fn format(&self) -> (u32, u16) {
        // SAFETY: the handle is open; the stream info lives as long as the handle.
        let info = unsafe { &*fdk_aac_sys::aacDecoder_GetStreamInfo(self.handle) };
        (info.sampleRate.max(0) as u32, info.numChannels.max(0) as u16)
    }
}

impl Drop for Decoder {
    fn drop(&mut self) {
        // SAFETY: the handle was opened by `new` and is closed once.
        unsafe { fdk_aac_sys::aacDecoder_Close(self.handle) }
    }
}
