//! Download and extraction: the repository tarball at the pinned commit, with the installation token, unpacked
//! without its top-level directory. Nothing may land outside the deployment directory: absolute paths, `..`,
//! links and special files are refused.

use std::io::Read;
use std::path::{Component, Path, PathBuf};

use futures::StreamExt;

use super::{DeployError, DeploySettings, Step, DOWNLOAD_TIMEOUT, MAX_TARBALL_BYTES};
use crate::model::Deployment;

/// `{base}/{owner}/{repo}/tarball/{sha}` with `Authorization: Bearer <token>`, at most `MAX_TARBALL_BYTES`.
pub(super) async fn download(
    settings: &DeploySettings,
    deployment: &Deployment,
    token: &str,
) -> Result<Vec<u8>, DeployError> {
    let base = settings.tarball_base.as_str().trim_end_matches('/');
    let url = format!("{base}/{}/tarball/{}", deployment.repository, deployment.commit_sha);
    let fail = |reason: String| DeployError::at(Step::Download, reason);
    // The network, a timeout, GitHub failing or limiting: the same download may work later.
    let for_now = |reason: String| DeployError::for_now(Step::Download, reason);
    let response = settings
        .http
        .get(&url)
        .bearer_auth(token)
        .header("accept", "application/vnd.github+json")
        .timeout(DOWNLOAD_TIMEOUT)
        .send()
        .await
        .map_err(|e| for_now(format!("{url}: {e}")))?;
    let status = response.status();
    if !status.is_success() {
        let again = status.is_server_error() || matches!(status.as_u16(), 408 | 429);
        let reason = format!("{url}: HTTP {}", status.as_u16());
        return Err(if again { for_now(reason) } else { fail(reason) });
    }
    let mut body = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| for_now(format!("{url}: {e}")))?;
        if body.len() as u64 + chunk.len() as u64 > MAX_TARBALL_BYTES {
            return Err(fail(format!("tarball larger than {MAX_TARBALL_BYTES} bytes")));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Unpack a gzipped tarball into `into`, dropping the first path component (GitHub's `owner-repo-sha/`).
pub(super) fn extract(tarball: &[u8], into: &Path) -> Result<(), DeployError> {
    let fail = |reason: String| DeployError::at(Step::Extract, reason);
    std::fs::create_dir_all(into).map_err(|e| fail(format!("{}: {e}", into.display())))?;
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(tarball));
    let mut files = 0usize;
    for entry in archive.entries().map_err(|e| fail(format!("not a tar.gz: {e}")))? {
        let mut entry = entry.map_err(|e| fail(format!("corrupt archive: {e}")))?;
        let path = entry.path().map_err(|e| fail(format!("bad path: {e}")))?.into_owned();
        let Some(relative) = inside(&path) else {
            return Err(fail(format!("refused path {}", path.display())));
        };
        if relative.as_os_str().is_empty() {
            continue;
        }
        let target = into.join(&relative);
        let kind = entry.header().entry_type();
        if kind.is_dir() {
            std::fs::create_dir_all(&target).map_err(|e| fail(format!("{}: {e}", target.display())))?;
        } else if kind.is_file() {
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent).map_err(|e| fail(format!("{}: {e}", parent.display())))?;
            }
            let mut content = Vec::new();
            entry.read_to_end(&mut content).map_err(|e| fail(format!("{}: {e}", relative.display())))?;
            std::fs::write(&target, &content).map_err(|e| fail(format!("{}: {e}", target.display())))?;
            let mode = entry.header().mode().unwrap_or(0o644) & 0o755;
            set_mode(&target, mode);
            files += 1;
        } else if kind.is_pax_global_extensions() || kind.is_pax_local_extensions() || kind.is_gnu_longname() {
            continue;
        } else {
            // Links and devices could point outside the deployment: refused.
            return Err(fail(format!("refused entry {} ({kind:?})", relative.display())));
        }
    }
    if files == 0 {
        return Err(fail("the archive holds no files".into()));
    }
    Ok(())
}

/// The path without its first component, if every remaining component stays inside.
fn inside(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for component in path.components().skip(1) {
        match component {
            Component::Normal(part) => out.push(part),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    if path.is_absolute() {
        return None;
    }
    Some(out)
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tarball(entries: &[(&str, &[u8])]) -> Vec<u8> {
        let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast()));
        for (path, content) in entries {
            let mut header = tar::Header::new_gnu();
            header.set_size(content.len() as u64);
            header.set_mode(0o644);
            header.set_cksum();
            builder.append_data(&mut header, path, *content).unwrap();
        }
        builder.into_inner().unwrap().finish().unwrap()
    }

    #[test]
    fn the_top_directory_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let archive = tarball(&[("owner-repo-abc/package.json", b"{}"), ("owner-repo-abc/src/index.js", b"x")]);
        extract(&archive, dir.path()).unwrap();
        assert!(dir.path().join("package.json").is_file());
        assert!(dir.path().join("src/index.js").is_file());
    }

    #[test]
    fn paths_leaving_the_directory_are_refused() {
        assert_eq!(inside(Path::new("top/../../etc/passwd")), None);
        assert_eq!(inside(Path::new("/top/etc/passwd")), None);
        assert_eq!(inside(Path::new("top/./a/b")), Some(PathBuf::from("a/b")));
        let dir = tempfile::tempdir().unwrap();
        let err = extract(b"not a tarball at all", dir.path()).unwrap_err();
        assert_eq!(err.step, Step::Extract);
    }
}
