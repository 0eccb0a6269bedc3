//! Opening a path beneath ROOT so that nothing, symlinks included, can lead outside it.
//!
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)` makes the kernel enforce it in
//! one race-free call. Kernels before 5.6 (or sandboxes that hide `openat2`) fall
//! back to opening the path and checking its canonical form lies under ROOT.

use std::ffi::CString;
use std::fs::{File, Metadata};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::Refusal;

/// The served directory, held open.
pub struct Root {
    dir: File,
    path: PathBuf,
    /// Unique per `Root` opened by this process: the open-file cache keys entries
    /// by it, so after a reload no file bound under the previous ROOT is served.
    id: u64,
}

static NEXT_ROOT_ID: AtomicU64 = AtomicU64::new(0);

static OPENAT2_MISSING: AtomicBool = AtomicBool::new(false);

impl Root {
    pub fn new(path: &Path) -> io::Result<Root> {
        let dir = File::open(path)?;
        Ok(Root { dir, path: path.to_path_buf(), id: NEXT_ROOT_ID.fetch_add(1, Ordering::Relaxed) })
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// The directory, as it was given.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens `rel` (relative, already normalised) read-only and returns it with its metadata.
    pub fn open(&self, rel: &Path) -> Result<(File, Metadata), Refusal> {
        let target = if rel.as_os_str().is_empty() { Path::new(".") } else { rel };
        let c = CString::new(target.as_os_str().as_bytes()).map_err(|_| Refusal::BadPath("NUL byte"))?;
        let file = if OPENAT2_MISSING.load(Ordering::Relaxed) {
            self.open_checked(target)
        } else {
            match crate::sys::open_beneath(&self.dir, &c) {
                Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
                    OPENAT2_MISSING.store(true, Ordering::Relaxed);
                    self.open_checked(target)
                }
                // RESOLVE_BENEATH refuses every absolute symlink, even one whose target
                // lies inside ROOT: resolve it, then open the symlink-free path beneath ROOT.
                Err(e) if e.raw_os_error() == Some(libc::EXDEV) => self.open_canonical_beneath(target),
                other => other.map_err(refusal),
            }
        }?;
        let meta = file.metadata().map_err(refusal)?;
        Ok((file, meta))
    }

    fn open_canonical_beneath(&self, rel: &Path) -> Result<File, Refusal> {
        let canonical = self.path.join(rel).canonicalize().map_err(refusal)?;
        let inside = canonical.strip_prefix(&self.path).map_err(|_| Refusal::OutsideRoot)?;
        let inside = if inside.as_os_str().is_empty() { Path::new(".") } else { inside };
        let c = CString::new(inside.as_os_str().as_bytes()).map_err(|_| Refusal::BadPath("NUL byte"))?;
        crate::sys::open_beneath(&self.dir, &c).map_err(refusal)
    }

    fn open_checked(&self, rel: &Path) -> Result<File, Refusal> {
        let full = self.path.join(rel);
        let canonical = full.canonicalize().map_err(refusal)?;
        if !canonical.starts_with(&self.path) {
            return Err(Refusal::OutsideRoot);
        }
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(&canonical)
            .map_err(refusal)
    }
}

fn refusal(e: io::Error) -> Refusal {
    match e.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::ENOTDIR) | Some(libc::ENAMETOOLONG) => Refusal::NotFound,
        Some(libc::EXDEV) | Some(libc::ELOOP) => Refusal::OutsideRoot,
        Some(libc::EACCES) | Some(libc::EPERM) => Refusal::Forbidden("permission denied"),
        Some(libc::EMFILE) | Some(libc::ENFILE) => Refusal::NoDescriptors,
        _ => Refusal::Forbidden("cannot open"),
    }
}
