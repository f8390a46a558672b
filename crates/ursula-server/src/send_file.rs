//! Response bytes that come from a local file leave with `sendfile(2)`: the kernel passes the
//! file's page-cache pages to the socket, and the bytes never cross user space.
//!
//! hyper writes bodies from [`Bytes`] and offers no file path. So a file whose bytes a response
//! may carry is mapped read-only ([`Mapped`]); a reader hands hyper [`Bytes`] that are slices of
//! the mapping ([`Mapped::bytes`]), and [`SendFile`], between hyper and the socket, recognises
//! a buffer inside a live mapping by its address and sends the same range of the file with
//! `sendfile` instead of copying the buffer. The two are the same bytes (the mapping *is* the
//! file's page cache), so whatever hyper does with the buffers, a client gets the right bytes:
//! should hyper ever copy a body into its own buffer, that copy is written as usual (and reads
//! the mapping), only slower. In the normal case the mapping's pages are never touched by this
//! process at all.
//!
//! Only immutable files may be mapped: cold objects are created whole (written aside, then
//! renamed into place) and never written again; a deleted one stays readable while mapped.
//! Buffers under [`SENDFILE_MIN`] are not looked up (a response head, an append's answer):
//! the check then costs one atomic load per write while no file is mapped, and a length
//! comparison per buffer otherwise.

use bytes::Bytes;
use rustix::io::Errno;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, Weak};
use std::task::{Context, Poll, ready};
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;

/// Buffers shorter than this are written, not sent from their file.
pub const SENDFILE_MIN: usize = 8 * 1024;

/// The most one `sendfile` call is asked to send; the rest goes in the calls after it. One call
/// for a whole buffer (up to 1 MiB) made loopback reads three times as expensive on a 6.18
/// kernel: `read-10x1MiB` from the local cold tier, five alternating pairs of 4 s runs, took
/// 381–560 µs of server CPU per 1 MiB GET (1,864–2,728 MB/s) uncapped and 142–156 µs
/// (6,668–7,297 MB/s) at 128 KiB per call (docs/benchmarks.md, session 33).
pub const SENDFILE_MAX: usize = 128 * 1024;

/// Live mappings by start address: their length and the mapping. An `Arc` upgraded from an
/// entry is never dropped while the lock is held (the last drop takes the write lock).
static MAPS: RwLock<BTreeMap<usize, (usize, Weak<Mapped>)>> = RwLock::new(BTreeMap::new());
static LIVE: AtomicUsize = AtomicUsize::new(0);
/// Bytes sent with `sendfile` since start (`ursula_cold_sendfile_bytes_total`).
pub static SENT: AtomicU64 = AtomicU64::new(0);

/// A read-only mapping of a whole immutable file, registered so that [`SendFile`] can find it.
pub struct Mapped {
    file: File,
    map: memmap2::Mmap,
    /// The file's device and inode.
    id: (u64, u64),
}

impl std::fmt::Debug for Mapped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mapped")
            .field("len", &self.map.len())
            .finish()
    }
}

impl Mapped {
    /// Maps `file` (whose bytes must never change while it is open; see the module docs).
    pub fn new(file: File) -> io::Result<Arc<Mapped>> {
        // SAFETY: the mapping is read-only and the callers only map cold objects, which are
        // never written or truncated once created (a `local` store writes an object to a
        // staging name and renames it into place), so the bytes behind the mapping never
        // change while it lives. Deleting the file leaves the mapping readable.
        #[allow(
            unsafe_code,
            reason = "mapping an immutable file; see the SAFETY comment"
        )]
        let map = unsafe { memmap2::MmapOptions::new().map(&file)? };
        use std::os::unix::fs::MetadataExt;
        let meta = file.metadata()?;
        let id = (meta.dev(), meta.ino());
        let mapped = Arc::new(Mapped { file, map, id });
        if !mapped.map.is_empty() {
            let mut maps = MAPS.write().unwrap_or_else(|e| e.into_inner());
            let entry = (mapped.map.len(), Arc::downgrade(&mapped));
            maps.insert(mapped.map.as_ptr() as usize, entry);
            LIVE.fetch_add(1, Ordering::Relaxed);
        }
        Ok(mapped)
    }

    /// The file's length.
    pub fn len(&self) -> u64 {
        self.map.len() as u64
    }

    /// Bytes `[start, end)` of the file, as a slice of the mapping (nothing is read).
    pub fn bytes(self: &Arc<Self>, start: usize, end: usize) -> Bytes {
        Bytes::from_owner(Whole(self.clone())).slice(start..end)
    }

    /// Whether `meta` describes the mapped file (same device and inode).
    pub fn same_file(&self, meta: &std::fs::Metadata) -> bool {
        use std::os::unix::fs::MetadataExt;
        self.id == (meta.dev(), meta.ino())
    }

    /// Reads `[start, end)` of the file into memory (a copy: for bytes that must be checked).
    pub fn read(&self, start: u64, end: u64) -> io::Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let mut buf = vec![0; usize::try_from(end - start).unwrap_or(0)];
        self.file.read_exact_at(&mut buf, start)?;
        Ok(buf)
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        if !self.map.is_empty() {
            let mut maps = MAPS.write().unwrap_or_else(|e| e.into_inner());
            maps.remove(&(self.map.as_ptr() as usize));
            LIVE.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// The owner of [`Mapped::bytes`]: the whole mapping.
struct Whole(Arc<Mapped>);

impl AsRef<[u8]> for Whole {
    fn as_ref(&self) -> &[u8] {
        &self.0.map
    }
}

/// The mapping `buf` lies in, and where `buf` starts in its file.
fn source_of(buf: &[u8]) -> Option<(Arc<Mapped>, u64)> {
    if buf.len() < SENDFILE_MIN || LIVE.load(Ordering::Relaxed) == 0 {
        return None;
    }
    let at = buf.as_ptr() as usize;
    let (base, weak) = {
        let maps = MAPS.read().unwrap_or_else(|e| e.into_inner());
        let (&base, (len, weak)) = maps.range(..=at).next_back()?;
        if at + buf.len() > base + len {
            return None;
        }
        (base, weak.clone())
    };
    // Upgraded after the lock is released: dropping this `Arc` may drop the mapping, whose
    // `Drop` takes the write lock. (Live mappings never overlap, so the one found is the one
    // whose `Bytes` holds `buf`, alive while `buf` is.)
    let mapped = weak.upgrade()?;
    Some((mapped, (at - base) as u64))
}

/// Whether `buf` lies in a live mapping (for other modules' tests).
#[cfg(test)]
pub fn tests_source_of(buf: &[u8]) -> bool {
    source_of(buf).is_some()
}

/// A connection's socket, sending buffers that lie in a [`Mapped`] file with `sendfile`.
#[derive(Debug)]
pub struct SendFile {
    inner: TcpStream,
    /// Bytes read from the socket before hyper took it (`h1`): read before the socket's.
    prefix: Bytes,
}

impl SendFile {
    /// A socket whose reads start with `prefix`, bytes already taken from it.
    pub fn with_prefix(inner: TcpStream, prefix: Bytes) -> Self {
        SendFile { inner, prefix }
    }

    /// Sends `buf`, which is bytes `offset..` of `file`, from the file: the count sent, at
    /// least one byte. A file system without `sendfile` gets `buf` written instead.
    fn poll_send(
        &self,
        cx: &mut Context<'_>,
        buf: &[u8],
        file: &File,
        offset: u64,
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.inner.poll_write_ready(cx))?;
            let sent = self.inner.try_io(Interest::WRITABLE, || {
                let mut at = offset;
                match rustix::fs::sendfile(
                    &self.inner,
                    file,
                    Some(&mut at),
                    buf.len().min(SENDFILE_MAX),
                ) {
                    Ok(n) => Ok((n, true)),
                    Err(Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP) => {
                        rustix::io::write(&self.inner, buf)
                            .map(|n| (n, false))
                            .map_err(io::Error::from)
                    }
                    Err(e) => Err(io::Error::from(e)),
                }
            });
            match sent {
                Ok((0, _)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Ok((n, by_sendfile)) => {
                    if by_sendfile {
                        SENT.fetch_add(n as u64, Ordering::Relaxed);
                    }
                    return Poll::Ready(Ok(n));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncRead for SendFile {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.prefix.is_empty() {
            let n = this.prefix.len().min(buf.remaining());
            buf.put_slice(&this.prefix.split_to(n));
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for SendFile {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match source_of(buf) {
            Some((m, offset)) => this.poll_send(cx, buf, &m.file, offset),
            None => Pin::new(&mut this.inner).poll_write(cx, buf),
        }
    }

    /// Writes the buffers before the first one that lies in a mapped file as usual; when the
    /// first does, sends it and the mapped buffers after it, while the socket takes them.
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let mut sent = 0;
        for (i, buf) in bufs.iter().enumerate() {
            let Some((m, offset)) = source_of(buf) else {
                if sent > 0 {
                    break;
                }
                continue;
            };
            if sent == 0 && i > 0 {
                return Pin::new(&mut this.inner).poll_write_vectored(cx, &bufs[..i]);
            }
            match this.poll_send(cx, buf, &m.file, offset) {
                Poll::Ready(Ok(n)) => {
                    sent += n;
                    if n < buf.len() {
                        break;
                    }
                }
                Poll::Ready(Err(e)) if sent == 0 => return Poll::Ready(Err(e)),
                // What was sent is reported; the error comes back on the next call.
                Poll::Ready(Err(_)) | Poll::Pending if sent > 0 => break,
                other => return other,
            }
        }
        if sent > 0 {
            return Poll::Ready(Ok(sent));
        }
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;
    use std::io::Write;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn only_mapped_buffers_of_sendfile_size_are_found() {
        let mut f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        f.write_all(&data).unwrap();
        let m = Mapped::new(f).unwrap();
        let b = m.bytes(1000, 1000 + SENDFILE_MIN);
        assert_eq!(&b[..], &data[1000..1000 + SENDFILE_MIN]);
        let (found, at) = source_of(&b).unwrap();
        assert!(Arc::ptr_eq(&found, &m));
        assert_eq!(at, 1000);
        assert!(source_of(&m.bytes(0, SENDFILE_MIN - 1)).is_none());
        let copy = b.to_vec();
        assert!(source_of(&copy).is_none(), "a copy is not the file");
        drop((b, found));
        let addr = m.map.as_ptr() as usize;
        // The last reference dropped right after a lookup (the lookup holds no lock then).
        let b = m.bytes(0, SENDFILE_MIN);
        drop(m);
        let (last, _) = source_of(&b).unwrap();
        drop(b);
        drop(last);
        assert!(!MAPS.read().unwrap().contains_key(&addr));
    }

    /// A mapped temporary file of `len` patterned bytes.
    fn mapped_file(len: u32) -> Arc<Mapped> {
        let mut f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..len).map(|i| (i * 7 % 253) as u8).collect();
        f.write_all(&data).unwrap();
        Mapped::new(f).unwrap()
    }

    /// Writes `pieces` with vectored writes, as hyper does, until every byte is out, then
    /// shuts the socket down. Returns how many writes ended inside a buffer (short sends,
    /// which only back-pressure causes: the wrapper otherwise stops only between buffers).
    async fn write_all_vectored(mut io: SendFile, mut pieces: Vec<Bytes>) -> usize {
        let mut short = 0;
        while !pieces.is_empty() {
            let slices: Vec<IoSlice<'_>> = pieces.iter().map(|p| IoSlice::new(p)).collect();
            let mut n = io.write_vectored(&slices).await.unwrap();
            if n < pieces[0].len() {
                short += 1;
            }
            while n > 0 {
                let take = n.min(pieces[0].len());
                bytes::Buf::advance(&mut pieces[0], take);
                n -= take;
                if pieces[0].is_empty() {
                    pieces.remove(0);
                }
            }
        }
        io.shutdown().await.unwrap();
        short
    }

    /// Sends `pieces` through a [`SendFile`] over a loopback connection and returns what the
    /// client read and how many writes were short. With `squeeze`, the sender's buffer is
    /// 4 KiB and the client reads 4 KiB at a time, yielding between reads (back-pressure).
    async fn send_over_loopback(pieces: Vec<Bytes>, squeeze: bool) -> (Vec<u8>, usize) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let writer = tokio::spawn(async move {
            let (sock, _) = listener.accept().await.unwrap();
            if squeeze {
                socket2::SockRef::from(&sock)
                    .set_send_buffer_size(4096)
                    .unwrap();
            }
            write_all_vectored(SendFile::with_prefix(sock, Bytes::new()), pieces).await
        });
        let mut client = TcpStream::connect(addr).await.unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = client.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
            if squeeze {
                tokio::task::yield_now().await;
            }
        }
        (got, writer.await.unwrap())
    }

    #[tokio::test]
    async fn a_mixed_write_arrives_byte_exact_and_the_file_part_by_sendfile() {
        let m = mapped_file(300_000);
        let pieces = vec![
            Bytes::from_static(b"head\r\n"),
            m.bytes(10, 70_000),
            Bytes::from_static(b"-"),
            m.bytes(100_000, 300_000),
            m.bytes(5, 9),
        ];
        let want: Vec<u8> = pieces.iter().flat_map(|p| p.to_vec()).collect();
        let before = SENT.load(Ordering::Relaxed);
        let (got, _) = send_over_loopback(pieces, false).await;
        assert!(got == want, "the bytes differ");
        let by_sendfile = SENT.load(Ordering::Relaxed) - before;
        assert!(
            by_sendfile >= (70_000 - 10) + 200_000,
            "only {by_sendfile} bytes went by sendfile"
        );
    }

    #[tokio::test]
    async fn short_sends_under_back_pressure_arrive_byte_exact() {
        // A small send buffer and a reader that takes a little at a time: `sendfile` and the
        // plain writes return short counts and `WouldBlock`, and every byte still arrives
        // once and in order.
        let m = mapped_file(600_000);
        let pieces = vec![
            m.bytes(0, 200_000),
            Bytes::from(vec![7u8; 50_000]),
            m.bytes(200_000, 600_000),
        ];
        let want: Vec<u8> = pieces.iter().flat_map(|p| p.to_vec()).collect();
        let (got, short) = send_over_loopback(pieces, true).await;
        assert!(got == want, "the bytes differ");
        assert!(
            short > 0,
            "no write was short: the test did not apply back-pressure"
        );
    }
}
