//! A `datafusion-distributed` worker that runs the joins of its stages on a
//! GPU.
//!
//! ```text
//! cargo run --release --features distributed --example worker -- [--address 0.0.0.0:8080] [--device 0]
//! ```
//!
//! Start one per GPU (each with its own `--device` and port) on every host
//! of the cluster, and point the coordinator's worker resolver at their
//! addresses; the coordinator's session is built with
//! `with_distributed_gpu_join()` (docs/distributed.md). Without `--device`
//! the worker joins on the device the coordinator's `gpu_join.device` names.

use std::net::SocketAddr;

use datafusion::error::{DataFusionError, Result};
use datafusion_distributed::Worker;
use datafusion_gpu_join::GpuJoinConfig;
use datafusion_gpu_join::backend::cuda_backend;
use datafusion_gpu_join::distributed::GpuJoinWorker;
use tonic::transport::Server;

struct Args {
    address: SocketAddr,
    device: Option<usize>,
}

fn parse_args() -> Result<Args> {
    let usage = "usage: worker [--address HOST:PORT] [--device ORDINAL]";
    let mut args = Args { address: SocketAddr::from(([0, 0, 0, 0], 8080)), device: None };
    let mut given = std::env::args().skip(1);
    while let Some(flag) = given.next() {
        let value =
            given.next().ok_or_else(|| DataFusionError::Configuration(format!("{flag} needs a value; {usage}")))?;
        let invalid = |what: &str| DataFusionError::Configuration(format!("{flag} {value}: not {what}; {usage}"));
        match flag.as_str() {
            "--address" => args.address = value.parse().map_err(|_| invalid("an address such as 0.0.0.0:8080"))?,
            "--device" => args.device = Some(value.parse().map_err(|_| invalid("a device ordinal"))?),
            _ => return Err(DataFusionError::Configuration(format!("unknown argument {flag}; {usage}"))),
        }
    }
    Ok(args)
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = parse_args()?;
    let mut options = GpuJoinConfig::default();
    options.device = args.device.unwrap_or_default();
    // The worker serves either way: where no device is usable, its joins
    // stay on DataFusion's operator (or run on the CPU backend, if the
    // coordinator asks for it), and its log says why.
    match cuda_backend(&options) {
        Ok(backend) => println!("worker on {}: joins on {} (device {})", args.address, backend.name(), options.device),
        Err(why) => println!("worker on {}: no usable CUDA device ({why})", args.address),
    }
    let session = match args.device {
        Some(ordinal) => GpuJoinWorker::on_device(ordinal),
        None => GpuJoinWorker::new(),
    };
    Server::builder()
        .add_service(Worker::from_session_builder(session).into_worker_server())
        .serve(args.address)
        .await
        .map_err(|e| DataFusionError::External(Box::new(e)))
}
