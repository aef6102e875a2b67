//! A GET's body written straight into the caller's buffer as it arrives:
//! gathering it first (`GetResult::bytes`) costs a fresh allocation of the
//! whole body, whose pages fault in one by one, and a second copy; for a
//! stream's large reads that was the read path's largest cost (perf: page
//! faults under memmove, a quarter of the server's time).

use futures::StreamExt;
use object_store::GetResult;

/// Copies `got`'s body into `buf` from its start; returns the body's
/// length, which may differ from `buf`'s (bytes past `buf` are counted,
/// not kept), so the caller can refuse a short or long answer.
pub(crate) async fn read_into(got: GetResult, buf: &mut [u8]) -> object_store::Result<usize> {
    let mut body = got.into_stream();
    let mut at = 0usize;
    while let Some(part) = body.next().await {
        let part = part?;
        if at < buf.len() {
            let n = part.len().min(buf.len() - at);
            buf[at..at + n].copy_from_slice(&part[..n]);
        }
        at += part.len();
    }
    Ok(at)
}
