//! The one tokio runtime S3 requests run on.

use std::sync::OnceLock;

use tokio::runtime::{Builder, Runtime};

/// Engine threads block on S3 futures; two IO threads carry any number of
/// requests in flight (docs/s3-backing.md, section 8).
pub(crate) fn runtime() -> std::io::Result<&'static Runtime> {
    static RT: OnceLock<Runtime> = OnceLock::new();
    if let Some(rt) = RT.get() {
        return Ok(rt);
    }
    let rt = Builder::new_multi_thread().worker_threads(2).thread_name("s3-io").enable_all().build()?;
    // A racing first caller may have set it: either runtime is as good.
    Ok(RT.get_or_init(|| rt))
}
