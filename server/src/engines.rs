//! The engines every request shares, loaded once.
//!
//! `Engines` is loaded for one decoder. The decoder of `--decoder` (TAESD by default) is loaded
//! at start; the other one (the SD VAE, `decoder=full_vae`) is loaded the first time a request
//! asks for it and kept. Loading it lazily costs that first request the load time, and a second
//! copy of whisper and the UNet in memory (`Engines` owns its networks); loading both at start
//! would make every server pay that memory and start-up time, and most never serve the SD VAE.

use anyhow::Result;
use cadence::args::EngineArgs;
use cadence::frame_loop::report::RenderSetup;
use cadence::musetalk::{DecoderKind, Engines};
use cadence::{Backend, BackendChoice};
use cadence_engines::{EngineDevice, Profile};
use std::sync::{Arc, Mutex};
use std::time::Instant;

pub struct EngineSet {
    primary: Arc<Engines>,
    other: Mutex<Option<Arc<Engines>>>,
    args: EngineArgs,
    pub device: EngineDevice,
    pub profile: Profile,
    pub backend: Backend,
}

impl EngineSet {
    /// Loads the engines of `args` (seconds for the cpu-reduced profile, longer for `full`).
    pub fn load(args: &EngineArgs, backend: BackendChoice) -> Result<Self> {
        let (device, profile) = args.device()?;
        let backend = Backend::for_engines(backend, &device.device)?;
        let primary = Arc::new(args.load(&device, profile)?);
        Ok(Self { primary, other: Mutex::new(None), args: args.clone(), device, profile, backend })
    }

    /// Engines loaded before (tests start several servers on one set); `args` must describe them.
    pub fn with_engines(engines: Arc<Engines>, args: &EngineArgs, backend: BackendChoice) -> Result<Self> {
        let (device, _) = args.device()?;
        let backend = Backend::for_engines(backend, &device.device)?;
        let mut args = args.clone();
        args.decoder = engines.decoder_kind;
        Ok(Self { profile: engines.profile, primary: engines, other: Mutex::new(None), args, device, backend })
    }

    /// The engines for `decoder`, and the milliseconds spent loading them now (0 when they were
    /// loaded before). Blocks while loading: call it from a render thread.
    pub fn get(&self, decoder: DecoderKind) -> Result<(Arc<Engines>, f64)> {
        if self.primary.decoder_kind == decoder {
            return Ok((self.primary.clone(), 0.0));
        }
        let mut other = self.other.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = other.as_ref() {
            return Ok((e.clone(), 0.0));
        }
        let t = Instant::now();
        let mut args = self.args.clone();
        args.decoder = decoder;
        tracing::info!(decoder = ?decoder, "loading the engines of a second decoder");
        let e = Arc::new(args.load(&self.device, self.profile)?);
        *other = Some(e.clone());
        Ok((e, t.elapsed().as_secs_f64() * 1e3))
    }

    /// The engines for `decoder` if they are loaded; never loads (never blocks for long).
    pub fn if_loaded(&self, decoder: DecoderKind) -> Option<Arc<Engines>> {
        if self.primary.decoder_kind == decoder {
            return Some(self.primary.clone());
        }
        self.other.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn primary(&self) -> &Engines {
        &self.primary
    }

    /// Decoders loaded now.
    pub fn loaded(&self) -> Vec<DecoderKind> {
        let mut v = vec![self.primary.decoder_kind];
        v.extend(self.other.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|e| e.decoder_kind));
        v
    }

    pub fn setup(&self, engines: &Engines) -> RenderSetup {
        RenderSetup::new(&self.backend, &self.device, engines)
    }
}
