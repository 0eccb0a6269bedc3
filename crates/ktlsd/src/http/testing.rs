//! An in-memory [`Transport`] for tests: the peer's input is a script of chunks,
//! timeouts, failures and a close; everything sent is captured, file ranges
//! included, so a test reads the exact bytes a client would.

use std::collections::VecDeque;
use std::os::unix::fs::FileExt;
use std::time::Duration;

use tokio::sync::watch;

use super::Transport;
use crate::files::FileRange;
use crate::vocab::RecordLayer;

/// One thing the scripted peer does when the server reads.
#[derive(Debug, Clone)]
pub enum Step {
    /// These bytes arrive.
    Data(Vec<u8>),
    /// Nothing arrives within the read's timeout.
    Timeout,
    /// The connection fails.
    Fail,
    /// Nothing arrives until the read is abandoned (shutdown tests).
    Silence,
    /// These bytes arrive, and at the same moment the server is told to shut down
    /// (through [`Memory::shutdown`]).
    DataThenShutdown(Vec<u8>),
}

/// What the in-memory transport fails with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MemError {
    #[error("timed out")]
    Timeout,
    #[error("connection failed")]
    Broken,
}

/// The in-memory connection. When the script runs out, the peer has closed.
#[derive(Debug, Default)]
pub struct Memory {
    script: VecDeque<Step>,
    /// Every byte sent, in order.
    pub output: Vec<u8>,
    /// The timeouts reads were given, in order.
    pub read_timeouts: Vec<Duration>,
    /// The server's shutdown signal, for [`Step::DataThenShutdown`].
    pub shutdown: Option<watch::Sender<bool>>,
    /// Whether the close was asked to linger.
    pub lingered: bool,
    /// Sends from this many on fail with this error (0: the first send fails).
    pub fail_sends: Option<(usize, MemError)>,
    sends: usize,
    /// What `next_record` answers; 0 means a full record (16384).
    pub record: usize,
    /// The length of each send, head and body together.
    pub send_lens: Vec<usize>,
}

impl Memory {
    pub fn new(script: impl IntoIterator<Item = Step>) -> Memory {
        Memory { script: script.into_iter().collect(), ..Memory::default() }
    }

    /// A peer that sends `input` in one chunk, then closes.
    pub fn sending(input: &[u8]) -> Memory {
        Memory::new([Step::Data(input.to_vec())])
    }

    pub fn output_text(&self) -> String {
        String::from_utf8_lossy(&self.output).into_owned()
    }
}

impl Transport for Memory {
    type Error = MemError;

    fn timed_out(err: &MemError) -> bool {
        *err == MemError::Timeout
    }

    async fn read(&mut self, buf: &mut Vec<u8>, timeout: Duration) -> Result<usize, MemError> {
        self.read_timeouts.push(timeout);
        match self.script.pop_front() {
            None => Ok(0),
            Some(Step::Data(d)) => {
                buf.extend_from_slice(&d);
                Ok(d.len())
            }
            Some(Step::Timeout) => Err(MemError::Timeout),
            Some(Step::Fail) => Err(MemError::Broken),
            Some(Step::Silence) => std::future::pending().await,
            Some(Step::DataThenShutdown(d)) => {
                if let Some(tx) = &self.shutdown {
                    tx.send_replace(true);
                }
                buf.extend_from_slice(&d);
                Ok(d.len())
            }
        }
    }

    async fn send(&mut self, head: &[u8], body: Option<FileRange<'_>>) -> Result<u64, MemError> {
        self.sends += 1;
        if let Some((from, e)) = self.fail_sends {
            if self.sends > from {
                return Err(e);
            }
        }
        self.output.extend_from_slice(head);
        self.send_lens.push(head.len() + body.as_ref().map_or(0, |b| b.len() as usize));
        let Some(body) = body else { return Ok(0) };
        let mut bytes = vec![0; body.len() as usize];
        body.file.read_exact_at(&mut bytes, body.range.start).map_err(|_| MemError::Broken)?;
        self.output.extend_from_slice(&bytes);
        Ok(body.len())
    }

    fn next_record(&mut self) -> usize {
        if self.record == 0 {
            16384
        } else {
            self.record
        }
    }

    fn linger_on_close(&mut self, _stop: watch::Receiver<bool>) {
        self.lingered = true;
    }

    /// Bytes in memory are protected nowhere; they count as this process's.
    fn layer(&self) -> RecordLayer {
        RecordLayer::Userspace
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn scripts_and_captures() {
        let mut m = Memory::new([Step::Data(b"ab".to_vec()), Step::Timeout, Step::Fail]);
        let mut buf = Vec::new();
        assert_eq!(m.read(&mut buf, Duration::from_secs(1)).await, Ok(2));
        assert_eq!(m.read(&mut buf, Duration::from_secs(2)).await, Err(MemError::Timeout));
        assert!(Memory::timed_out(&MemError::Timeout) && !Memory::timed_out(&MemError::Broken));
        assert_eq!(m.read(&mut buf, Duration::from_secs(3)).await, Err(MemError::Broken));
        assert_eq!(m.read(&mut buf, Duration::from_secs(4)).await, Ok(0), "then closed");
        assert_eq!((buf.as_slice(), m.read_timeouts.len()), (&b"ab"[..], 4));

        let mut file = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut file, b"0123456789").unwrap();
        assert_eq!(m.send(b"H", Some(FileRange { file: &file, range: 3..6, cached: None })).await, Ok(3));
        m.fail_sends = Some((1, MemError::Broken));
        assert_eq!(m.send(b"X", None).await, Err(MemError::Broken));
        assert_eq!(m.output, b"H345");
    }
}
