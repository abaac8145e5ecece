//! A CycloneDX 1.5 JSON software bill of materials for an image: the base
//! (by digest), rtdeploy itself (deploy and the other programs of its
//! that the robot runs) and each controller program.

use serde_json::{json, Value};

/// A component of the image named in the SBOM.
#[derive(Debug, Clone)]
pub struct Component {
    pub name: String,
    pub version: Option<String>,
    /// Where it sits in the image.
    pub path: String,
    pub sha256: String,
}

/// The inputs of the SBOM.
#[derive(Debug, Clone)]
pub struct SbomInput<'a> {
    pub robot: &'a str,
    pub version: &'a str,
    pub rtdeploy_version: &'a str,
    pub source_date_epoch: u64,
    /// What the base was (`dir`, `tar`, `none`) and its digest.
    pub base_kind: &'a str,
    pub base_sha256: Option<&'a str>,
    /// sha256 of the image manifest: names every file of the image.
    pub image_manifest_sha256: &'a str,
    pub deploy: Component,
    /// rtdeploy's other programs in the image (the bridge).
    pub tools: Vec<Component>,
    pub controllers: Vec<Component>,
}

/// The SBOM document (CycloneDX 1.5, JSON).
pub fn render(i: &SbomInput) -> Value {
    let hashes = |sha: &str| json!([{ "alg": "SHA-256", "content": sha }]);
    let mut components = Vec::new();
    let mut base = json!({
        "type": "operating-system",
        "bom-ref": "base",
        "name": "base root filesystem",
        "description": format!("the base the image was built from ({})", i.base_kind),
    });
    if let Some(sha) = i.base_sha256 {
        base["hashes"] = hashes(sha);
    }
    components.push(base);
    components.push(json!({
        "type": "application",
        "bom-ref": "rtdeploy",
        "name": "rtdeploy",
        "version": i.rtdeploy_version,
        "hashes": hashes(&i.deploy.sha256),
        "properties": [{ "name": "rtdeploy:path", "value": i.deploy.path }],
    }));
    for t in &i.tools {
        components.push(json!({
            "type": "application",
            "bom-ref": format!("rtdeploy:{}", t.path),
            "name": t.name,
            "version": t.version,
            "hashes": hashes(&t.sha256),
            "properties": [{ "name": "rtdeploy:path", "value": t.path }],
        }));
    }
    for c in &i.controllers {
        let mut v = json!({
            "type": "application",
            "bom-ref": format!("controller:{}", c.path),
            "name": c.name,
            "hashes": hashes(&c.sha256),
            "properties": [{ "name": "rtdeploy:path", "value": c.path }],
        });
        if let Some(ver) = &c.version {
            v["version"] = json!(ver);
        }
        components.push(v);
    }
    json!({
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "serialNumber": format!("urn:uuid:{}", uuid_from(i.image_manifest_sha256)),
        "version": 1,
        "metadata": {
            "timestamp": rfc3339(i.source_date_epoch),
            "tools": { "components": [{ "type": "application", "name": "rtdeploy", "version": i.rtdeploy_version }] },
            "component": {
                "type": "firmware",
                "bom-ref": "image",
                "name": format!("{} root filesystem", i.robot),
                "version": i.version,
                "properties": [{ "name": "rtdeploy:image-manifest-sha256", "value": i.image_manifest_sha256 }],
            },
        },
        "components": components,
        "dependencies": [{
            "ref": "image",
            "dependsOn": components.iter().map(|c| c["bom-ref"].clone()).collect::<Vec<_>>(),
        }],
    })
}

/// A version-4-shaped UUID taken from the first 16 bytes of a hex digest,
/// so the same image always gets the same serial number.
pub fn uuid_from(hex_digest: &str) -> String {
    let mut b = [0u8; 16];
    let raw = hex::decode(hex_digest).unwrap_or_default();
    for (d, s) in b.iter_mut().zip(raw.iter()) {
        *d = *s;
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex::encode(b);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// Seconds since the epoch as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn rfc3339(secs: u64) -> String {
    let t = releases::utc::utc(secs);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        t.year, t.month, t.day, t.hour, t.minute, t.second
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
    }

    #[test]
    fn uuid_shape() {
        let u = uuid_from(&"ab".repeat(32));
        assert_eq!(u.len(), 36);
        assert_eq!(&u[14..15], "4");
        assert!(matches!(&u[19..20], "8" | "9" | "a" | "b"));
    }
}
