//! TensorRT backend (feature `tensorrt`): runs serialized TensorRT engine files ("plans") for the
//! UNet and the decoder behind the same traits as the candle engines.
//!
//! Uses `trtx` with its `enterprise` flavour (standard TensorRT, `libnvinfer.so`, loaded at run
//! time with dlopen) and `cudarc` (CUDA driver API, also loaded at run time) for device buffers.
//! Nothing is linked at build time; a missing library, GPU or engine file is an [`EngineError`].
//!
//! Engine I/O convention (what `trtexec --onnx=... --saveEngine=...` produces from the usual
//! diffusers ONNX exports), all `float32`:
//! - UNet: one rank-4 input (B, 8, 32, 32) (latents), one rank-3 input (B, 50, 384) (audio *after*
//!   the positional encoding; [`TensorRtUnet`] adds it on the host exactly as the candle engine
//!   does), an optional rank-0/1 input (timestep, filled with 0), one output (B, 4, 32, 32).
//! - Decoder: one rank-4 input (B, 4, h, w), one output (B, 3, 8h, 8w). Whether latents are
//!   pre-scaled is a property of the exported graph: the caller states it with
//!   [`DecoderScaling`].
//!
//! A dynamic batch dimension (-1) is set per call; fixed dimensions are checked against inputs.
//! Not run in this repository's CI (no GPU, no TensorRT); it is only compiled there.

use crate::{
    Batch, Engine, EngineError, EngineInfo, KeyframeModel, LatentDecoder, ModelKind, Profile, Result, Runtime,
};
use cudarc::driver::{CudaContext, CudaStream, DevicePtr, DevicePtrMut};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

fn trt_err(what: &str, e: impl std::fmt::Display) -> EngineError {
    EngineError::Unavailable(format!("TensorRT: {what}: {e}"))
}

struct Quiet;
impl trtx::LogHandler for Quiet {
    fn log(&self, severity: trtx::Severity, message: &str) {
        if matches!(severity, trtx::Severity::Error | trtx::Severity::InternalError) {
            eprintln!("TensorRT: {message}");
        }
    }
}

#[derive(Debug, Clone)]
struct Io {
    name: String,
    shape: Vec<i64>,
    input: bool,
}

/// A deserialized engine and its execution context. The TensorRT objects borrow each other
/// (logger <- runtime <- engine <- context), so the first three are leaked to get `'static`
/// lifetimes: an engine lives as long as the process that loaded it, which is how cadence uses it.
struct Session {
    ctx: Mutex<trtx::ExecutionContext<'static>>,
    io: Vec<Io>,
    stream: Arc<CudaStream>,
    file: PathBuf,
}

// SAFETY: a TensorRT execution context may be used from any thread but not concurrently; every
// use goes through the Mutex. The CUDA stream handle is thread-safe.
unsafe impl Send for Session {}
unsafe impl Sync for Session {}

impl Session {
    fn open(path: &Path) -> Result<Session> {
        let bytes = std::fs::read(path).map_err(|error| EngineError::Io { path: path.to_path_buf(), error })?;
        // SAFETY: only probes whether libcuda can be dlopen'ed. With the `cuda` feature candle
        // makes cudarc link libcuda (`dynamic-linking`): then it is present whenever the program
        // runs, and cudarc has no loader to probe.
        #[cfg(not(feature = "cuda"))]
        {
            if !unsafe { cudarc::driver::sys::is_culib_present() } {
                return Err(EngineError::Unavailable(
                    "TensorRT: the CUDA driver library (libcuda) is not present".into(),
                ));
            }
        }
        trtx::dynamically_load_tensorrt(None::<String>)
            .map_err(|e| trt_err("cannot load libnvinfer.so (is TensorRT installed and on LD_LIBRARY_PATH?)", e))?;
        let cuda = CudaContext::new(0).map_err(|e| trt_err("no CUDA device 0", e))?;
        let stream = cuda.default_stream();
        let logger: &'static trtx::Logger =
            Box::leak(Box::new(trtx::Logger::new(Quiet).map_err(|e| trt_err("logger", e))?));
        let runtime: &'static mut trtx::Runtime<'static> =
            Box::leak(Box::new(trtx::Runtime::new(logger).map_err(|e| trt_err("runtime", e))?));
        let engine: &'static mut trtx::CudaEngine<'static> = Box::leak(Box::new(
            runtime
                .deserialize_cuda_engine(&bytes)
                .map_err(|e| trt_err(&format!("cannot deserialize engine {}", path.display()), e))?,
        ));
        let n = engine.nb_io_tensors().map_err(|e| trt_err("io tensors", e))?;
        let mut io = Vec::new();
        for i in 0..n {
            let name = engine.io_tensor_name(i).map_err(|e| trt_err("io tensor name", e))?;
            let shape = engine.tensor_shape(&name).map_err(|e| trt_err("tensor shape", e))?;
            let dtype = engine.tensor_data_type(&name).map_err(|e| trt_err("tensor dtype", e))?;
            if dtype != trtx::DataType::kFLOAT {
                return Err(EngineError::BadInput(format!(
                    "TensorRT engine {}: tensor `{name}` is {dtype:?}; cadence feeds float32 tensors",
                    path.display()
                )));
            }
            let mode = engine.tensor_io_mode(&name).map_err(|e| trt_err("io mode", e))?;
            io.push(Io { name, shape, input: mode == trtx::TensorIOMode::kINPUT });
        }
        let ctx = engine.create_execution_context().map_err(|e| trt_err("execution context", e))?;
        Ok(Session { ctx: Mutex::new(ctx), io, stream, file: path.to_path_buf() })
    }

    fn find(&self, input: bool, rank: usize) -> Option<&Io> {
        self.io.iter().find(|t| t.input == input && t.shape.len() == rank)
    }

    fn check_shape(&self, t: &Io, got: &[usize]) -> Result<()> {
        let ok = t.shape.len() == got.len() && t.shape.iter().zip(got).all(|(&e, &g)| e < 0 || e as usize == g);
        if ok {
            Ok(())
        } else {
            Err(EngineError::BadInput(format!(
                "TensorRT engine {}: tensor `{}` expects shape {:?} (-1 = dynamic), got {got:?}",
                self.file.display(),
                t.name,
                t.shape
            )))
        }
    }

    /// Runs the engine: `inputs` (tensor, host data, shape); returns the single output.
    fn run(&self, inputs: &[(&Io, &[f32], Vec<usize>)], out_shape: Vec<usize>) -> Result<Batch> {
        let out =
            self.io.iter().find(|t| !t.input).ok_or_else(|| {
                EngineError::BadInput(format!("TensorRT engine {} has no output", self.file.display()))
            })?;
        self.check_shape(out, &out_shape)?;
        let mut ctx = self.ctx.lock().map_err(|_| EngineError::Unavailable("TensorRT context poisoned".into()))?;
        let s = &self.stream;
        let mut bufs = Vec::new();
        for (t, data, shape) in inputs {
            self.check_shape(t, shape)?;
            if t.shape.iter().any(|&d| d < 0) {
                let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
                ctx.set_input_shape(&t.name, &trtx::trtx_sys::Dims64::from_slice(&dims))
                    .map_err(|e| trt_err(&format!("set shape of `{}`", t.name), e))?;
            }
            let dev = s.clone_htod(*data).map_err(|e| trt_err("copy to device", e))?;
            bufs.push((t.name.clone(), dev));
        }
        let n_out: usize = out_shape.iter().product();
        let mut dout = s.alloc_zeros::<f32>(n_out).map_err(|e| trt_err("alloc", e))?;
        // SAFETY: every bound pointer is a live device allocation of exactly the tensor's size
        // (shapes checked above) that outlives the synchronous run below.
        unsafe {
            for (name, d) in &bufs {
                let (ptr, _g) = d.device_ptr(s);
                ctx.set_tensor_address(name, ptr as *mut _).map_err(|e| trt_err("bind input", e))?;
            }
            let (ptr, _g) = dout.device_ptr_mut(s);
            ctx.set_tensor_address(&out.name, ptr as *mut _).map_err(|e| trt_err("bind output", e))?;
            ctx.enqueue_v3(s.cu_stream() as *mut _).map_err(|e| trt_err("enqueue", e))?;
        }
        s.synchronize().map_err(|e| trt_err("synchronize", e))?;
        let host = s.clone_dtoh(&dout).map_err(|e| trt_err("copy to host", e))?;
        Batch::new(out_shape, host)
    }
}

/// MuseTalk UNet from a serialized TensorRT engine.
pub struct TensorRtUnet {
    s: Session,
    pe: Vec<f32>,
    info: EngineInfo,
}

impl TensorRtUnet {
    /// Loads `engine_file`; errors if the file, libcuda, libnvinfer or a GPU is missing, or if the
    /// engine's I/O does not follow the convention in the module docs.
    pub fn load(engine_file: &Path) -> Result<TensorRtUnet> {
        let s = Session::open(engine_file)?;
        if s.find(true, 4).is_none() || s.find(true, 3).is_none() {
            return Err(EngineError::BadInput(format!(
                "TensorRT engine {}: expected a rank-4 latent input and a rank-3 audio input, found {:?}",
                engine_file.display(),
                s.io.iter().map(|t| (&t.name, &t.shape)).collect::<Vec<_>>()
            )));
        }
        let pe = crate::unet::positional_encoding(crate::unet::AUDIO_TOKENS, crate::unet::AUDIO_DIM);
        let info = EngineInfo {
            model: ModelKind::MuseTalkUnet,
            profile: Profile::Full,
            weights: format!("tensorrt({})", engine_file.display()),
            num_params: crate::param_table(ModelKind::MuseTalkUnet, Profile::Full).map(|t| t.num_params()).unwrap_or(0),
            flops_per_frame: crate::unet::full_flops_per_frame(),
            runtime: Runtime::TensorRt,
        };
        Ok(TensorRtUnet { s, pe, info })
    }
}

impl Engine for TensorRtUnet {
    fn info(&self) -> &EngineInfo {
        &self.info
    }
}

impl KeyframeModel for TensorRtUnet {
    /// TensorRT engines are built from the full-size UNet.
    fn audio_dim(&self) -> usize {
        crate::unet::AUDIO_DIM
    }

    fn predict(&self, latents: &Batch, audio: &Batch) -> Result<Batch> {
        let b = latents.batch_size();
        latents.expect("TensorRT UNet latents", &[None, Some(8), Some(32), Some(32)])?;
        audio.expect("TensorRT UNet audio", &[Some(b), Some(50), Some(384)])?;
        let mut a = audio.data.clone();
        for (i, v) in a.iter_mut().enumerate() {
            *v += self.pe[i % self.pe.len()];
        }
        let lat = self.s.find(true, 4).expect("checked at load");
        let aud = self.s.find(true, 3).expect("checked at load");
        let zeros = vec![0f32; b];
        let mut inputs =
            vec![(lat, latents.data.as_slice(), latents.shape.clone()), (aud, a.as_slice(), audio.shape.clone())];
        if let Some(t) = self.s.find(true, 1) {
            inputs.push((t, &zeros[..], vec![b]));
        } else if let Some(t) = self.s.find(true, 0) {
            inputs.push((t, &zeros[..1], vec![]));
        }
        self.s.run(&inputs, vec![b, 4, 32, 32])
    }
}

/// How a TensorRT decoder graph expects its latents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecoderScaling {
    /// TAESD: latents as they are; output about [0, 1].
    Taesd,
    /// SD VAE graph without the 1/0.18215 scaling: the host divides first; output about [-1, 1].
    SdVaeUnscaled,
}

/// A latent decoder (TAESD or SD VAE) from a serialized TensorRT engine.
pub struct TensorRtDecoder {
    s: Session,
    scaling: DecoderScaling,
    info: EngineInfo,
}

impl TensorRtDecoder {
    pub fn load(engine_file: &Path, scaling: DecoderScaling) -> Result<TensorRtDecoder> {
        let s = Session::open(engine_file)?;
        if s.find(true, 4).is_none() {
            return Err(EngineError::BadInput(format!(
                "TensorRT engine {}: expected a rank-4 latent input",
                engine_file.display()
            )));
        }
        let model = match scaling {
            DecoderScaling::Taesd => ModelKind::TaesdDecoder,
            DecoderScaling::SdVaeUnscaled => ModelKind::SdVaeDecoder,
        };
        let info = EngineInfo {
            model,
            profile: Profile::Full,
            weights: format!("tensorrt({})", engine_file.display()),
            num_params: crate::param_table(model, Profile::Full).map(|t| t.num_params()).unwrap_or(0),
            // Not derived for an opaque engine graph.
            flops_per_frame: 0.0,
            runtime: Runtime::TensorRt,
        };
        Ok(TensorRtDecoder { s, scaling, info })
    }
}

impl Engine for TensorRtDecoder {
    fn info(&self) -> &EngineInfo {
        &self.info
    }
}

impl LatentDecoder for TensorRtDecoder {
    fn decode(&self, latents: &Batch) -> Result<Batch> {
        latents.expect("TensorRT decoder input", &[None, Some(4), None, None])?;
        let data: Vec<f32> = match self.scaling {
            DecoderScaling::Taesd => latents.data.clone(),
            DecoderScaling::SdVaeUnscaled => {
                latents.data.iter().map(|v| v / crate::sd_vae::SCALING_FACTOR as f32).collect()
            }
        };
        let t = self.s.find(true, 4).expect("checked at load");
        let (b, h, w) = (latents.shape[0], latents.shape[2], latents.shape[3]);
        self.s.run(&[(t, &data, latents.shape.clone())], vec![b, 3, 8 * h, 8 * w])
    }
    fn output_range(&self) -> (f32, f32) {
        match self.scaling {
            DecoderScaling::Taesd => (0.0, 1.0),
            DecoderScaling::SdVaeUnscaled => (-1.0, 1.0),
        }
    }
}
