//! The one way a release is named: `<version>-<sha8>`, the release's
//! version and the first eight hex digits of the sha256 of its manifest's
//! exact bytes. Two releases with the same manifest get the same name, and
//! any changed byte gets a new one. The installer names the directory of a
//! bundle's release with it, the image builder the release it places in
//! an image, and both sides of the update protocol the release they talk
//! about.

use crate::bundle::sha256_hex;

/// The name of the release whose manifest is `manifest_bytes`.
pub fn release_name(version: &str, manifest_bytes: &[u8]) -> String {
    format!("{version}-{}", sha256_hex(manifest_bytes).short())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_and_the_manifest_digest() {
        // sha256("abc") = ba7816bf...
        assert_eq!(release_name("1.0", b"abc"), "1.0-ba7816bf");
        assert_eq!(release_name("1.0", b"abc"), release_name("1.0", b"abc"));
        assert_ne!(release_name("1.0", b"abc"), release_name("1.0", b"abd"));
        assert_eq!(release_name("2.1.0", b""), "2.1.0-e3b0c442");
    }
}
