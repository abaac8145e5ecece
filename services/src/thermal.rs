//! Thermal zones: each zone's temperature and trip points from
//! `/sys/class/thermal/thermal_zone*` (see the kernel's
//! `Documentation/driver-api/thermal/sysfs-api.rst`), and whether it is at
//! or past a passive trip point: that is where the kernel's thermal
//! governor throttles the zone's cooling devices (CPU and GPU frequency on
//! a Jetson), so a real-time loop on the board runs slower than it was
//! measured.
//!
//! [`parse_millicelsius`] and [`ThermalZone::from_files`] are pure;
//! [`read`] is the only I/O, under a sysroot (`/` on a robot, a fake tree
//! in tests), and bounded: at most [`MAX_ZONES`] zones of the first
//! [`MAX_DIR_ENTRIES`] directory entries, [`MAX_TRIPS`] trip points a
//! zone, and a few dozen bytes of each file. sysfs text is read as hostile
//! as any other input: what does not parse is left out, never an error.

use std::path::Path;

use serde::Serialize;

/// The most zones shown (an Orin has about ten).
pub const MAX_ZONES: usize = 64;
/// The most entries of `/sys/class/thermal` looked at (it also lists the
/// cooling devices).
pub const MAX_DIR_ENTRIES: usize = 4096;
/// The most trip points read per zone.
pub const MAX_TRIPS: usize = 32;
/// The longest zone name kept.
const MAX_NAME: usize = 32;
/// `THERMAL_TEMP_INVALID`: a sensor or trip point with no reading.
const TEMP_INVALID_MC: i64 = -274_000;

/// Where the zones are, under the sysroot.
pub const THERMAL_DIR: &str = "sys/class/thermal";

/// One thermal zone.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ThermalZone {
    /// N of `thermal_zoneN`.
    pub zone: u32,
    /// Its `type` (`cpu-thermal`, `gpu-thermal`, `tj-thermal`, ...).
    pub name: String,
    /// Degrees Celsius; `None` when the sensor gave no reading.
    pub temp_c: Option<f64>,
    /// The lowest passive trip point, degrees Celsius.
    pub passive_c: Option<f64>,
    /// The lowest critical trip point (the kernel shuts down there).
    pub critical_c: Option<f64>,
    /// `false` when its `mode` is `disabled`: the kernel does not act on
    /// its trip points.
    pub enabled: bool,
    /// At or past a passive trip point in an enabled zone: the kernel
    /// throttles. Highlighted.
    pub throttling: bool,
}

/// The text of one zone's files, as read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ZoneFiles {
    pub kind: Option<String>,
    pub temp: Option<String>,
    pub mode: Option<String>,
    /// `trip_point_N_type` and `trip_point_N_temp`, in order.
    pub trips: Vec<(String, Option<String>)>,
}

/// A millidegree Celsius reading (`temp`, `trip_point_N_temp`): `None`
/// when it does not parse or is `THERMAL_TEMP_INVALID` (or below).
pub fn parse_millicelsius(text: &str) -> Option<i64> {
    let v: i64 = text.trim().parse().ok()?;
    (v > TEMP_INVALID_MC).then_some(v)
}

fn celsius(mc: i64) -> f64 {
    mc as f64 / 1000.0
}

/// A zone name fit to show: printable, at most [`MAX_NAME`] characters.
fn clean_name(text: &str) -> String {
    text.trim()
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .take(MAX_NAME)
        .collect()
}

impl ThermalZone {
    /// A zone from the text of its files.
    pub fn from_files(zone: u32, f: &ZoneFiles) -> ThermalZone {
        let temp = f.temp.as_deref().and_then(parse_millicelsius);
        let lowest = |kind: &str| {
            f.trips
                .iter()
                .filter(|(k, _)| k.trim() == kind)
                .filter_map(|(_, t)| t.as_deref().and_then(parse_millicelsius))
                .min()
        };
        let passive = lowest("passive");
        let enabled = f.mode.as_deref().map(str::trim) != Some("disabled");
        ThermalZone {
            zone,
            name: f
                .kind
                .as_deref()
                .map(clean_name)
                .unwrap_or_else(|| format!("thermal_zone{zone}")),
            temp_c: temp.map(celsius),
            passive_c: passive.map(celsius),
            critical_c: lowest("critical").map(celsius),
            enabled,
            throttling: enabled && matches!((temp, passive), (Some(t), Some(p)) if t >= p),
        }
    }
}

/// At most `max` bytes of a file as text; `None` when it cannot be read
/// (missing, or a sensor that answers with an error).
fn read_small(path: &Path, max: u64) -> Option<String> {
    // units::bounded: a FIFO is refused rather than waited on; more than
    // `max` bytes is not a sensor's answer.
    units::bounded::Bound::pseudo(max).read_lossy(path).ok()
}

/// The zones under `sysroot`, in zone order, and notes on what could not
/// be read. A board without thermal zones gives neither.
pub fn read(sysroot: &Path) -> (Vec<ThermalZone>, Vec<String>) {
    let dir = sysroot.join(THERMAL_DIR);
    let mut notes = Vec::new();
    let rd = match std::fs::read_dir(&dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return (Vec::new(), notes),
        Err(e) => {
            notes.push(format!("thermal zones unknown: {}: {e}", dir.display()));
            return (Vec::new(), notes);
        }
    };
    let mut ids: Vec<u32> = rd
        .take(MAX_DIR_ENTRIES)
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_prefix("thermal_zone")?
                .parse::<u32>()
                .ok()
        })
        .collect();
    ids.sort_unstable();
    ids.dedup();
    if ids.len() > MAX_ZONES {
        notes.push(format!(
            "{} thermal zones: the first {MAX_ZONES} shown",
            ids.len()
        ));
        ids.truncate(MAX_ZONES);
    }
    let zones = ids
        .into_iter()
        .map(|id| {
            let z = dir.join(format!("thermal_zone{id}"));
            let mut f = ZoneFiles {
                kind: read_small(&z.join("type"), 64),
                temp: read_small(&z.join("temp"), 32),
                mode: read_small(&z.join("mode"), 16),
                trips: Vec::new(),
            };
            for n in 0..MAX_TRIPS {
                let Some(kind) = read_small(&z.join(format!("trip_point_{n}_type")), 32) else {
                    break;
                };
                let temp = read_small(&z.join(format!("trip_point_{n}_temp")), 32);
                f.trips.push((kind, temp));
            }
            ThermalZone::from_files(id, &f)
        })
        .collect();
    (zones, notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_in_millidegrees_and_the_invalid_one() {
        assert_eq!(parse_millicelsius("48500\n"), Some(48_500));
        assert_eq!(parse_millicelsius("-5000"), Some(-5_000));
        assert_eq!(parse_millicelsius("-274000"), None);
        assert_eq!(parse_millicelsius(""), None);
        assert_eq!(parse_millicelsius("hot"), None);
        assert_eq!(parse_millicelsius("99999999999999999999999"), None);
    }

    fn files(temp: &str, trips: &[(&str, &str)]) -> ZoneFiles {
        ZoneFiles {
            kind: Some("cpu-thermal\n".into()),
            temp: Some(temp.into()),
            mode: None,
            trips: trips
                .iter()
                .map(|(k, t)| (k.to_string(), Some(t.to_string())))
                .collect(),
        }
    }

    #[test]
    fn a_zone_throttles_at_or_past_its_lowest_passive_trip() {
        let trips = [
            ("critical\n", "104500\n"),
            ("passive\n", "99000\n"),
            ("passive\n", "95500\n"),
            ("active\n", "50000\n"),
        ];
        let below = ThermalZone::from_files(1, &files("95499\n", &trips));
        assert_eq!(below.name, "cpu-thermal");
        assert_eq!(below.temp_c, Some(95.499));
        assert_eq!(below.passive_c, Some(95.5));
        assert_eq!(below.critical_c, Some(104.5));
        assert!(
            !below.throttling,
            "past an active trip only: fans, no throttling"
        );
        assert!(ThermalZone::from_files(1, &files("95500", &trips)).throttling);
        assert!(ThermalZone::from_files(1, &files("101000", &trips)).throttling);
        // A disabled zone is not acted on; a zone without a reading or
        // without a passive trip does not throttle.
        let mut off = files("101000", &trips);
        off.mode = Some("disabled\n".into());
        let off = ThermalZone::from_files(1, &off);
        assert!(!off.enabled && !off.throttling);
        assert!(!ThermalZone::from_files(1, &files("-274000", &trips)).throttling);
        assert!(!ThermalZone::from_files(1, &files("101000", &trips[..1])).throttling);
        // Garbage names are cut and made printable; no name, the zone's.
        let mut odd = files("1", &[]);
        odd.kind = Some(format!("a\u{1b}[31mb{}", "x".repeat(100)));
        let odd = ThermalZone::from_files(3, &odd);
        assert_eq!(odd.name.chars().count(), MAX_NAME);
        assert!(odd.name.starts_with("a?[31mb"), "{}", odd.name);
        odd.name.chars().for_each(|c| assert!(!c.is_control()));
        let mut none = files("1", &[]);
        none.kind = None;
        assert_eq!(ThermalZone::from_files(3, &none).name, "thermal_zone3");
    }

    fn zone(root: &Path, n: u32, kind: &str, temp: &str, trips: &[(&str, &str)]) {
        let z = root.join(THERMAL_DIR).join(format!("thermal_zone{n}"));
        std::fs::create_dir_all(&z).unwrap();
        std::fs::write(z.join("type"), format!("{kind}\n")).unwrap();
        std::fs::write(z.join("temp"), format!("{temp}\n")).unwrap();
        for (i, (k, t)) in trips.iter().enumerate() {
            std::fs::write(z.join(format!("trip_point_{i}_type")), format!("{k}\n")).unwrap();
            std::fs::write(z.join(format!("trip_point_{i}_temp")), format!("{t}\n")).unwrap();
        }
    }

    #[test]
    fn zones_below_and_at_a_passive_trip_from_a_fake_sysfs() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let trips = [("passive", "95500"), ("critical", "104500")];
        zone(root, 0, "cpu-thermal", "48250", &trips);
        zone(root, 1, "gpu-thermal", "95500", &trips);
        zone(root, 10, "tj-thermal", "96000", &[("active", "50000")]);
        // Cooling devices live in the same directory.
        std::fs::create_dir_all(root.join(THERMAL_DIR).join("cooling_device0")).unwrap();
        // A zone whose sensor cannot be read (a directory in place of the
        // file stands for a read error).
        let broken = root.join(THERMAL_DIR).join("thermal_zone2");
        std::fs::create_dir_all(broken.join("temp")).unwrap();
        std::fs::write(broken.join("type"), "PMIC-Die\n").unwrap();
        let (zones, notes) = read(root);
        assert!(notes.is_empty(), "{notes:?}");
        let got: Vec<(u32, &str, Option<f64>, bool)> = zones
            .iter()
            .map(|z| (z.zone, z.name.as_str(), z.temp_c, z.throttling))
            .collect();
        assert_eq!(
            got,
            [
                (0, "cpu-thermal", Some(48.25), false),
                (1, "gpu-thermal", Some(95.5), true),
                (2, "PMIC-Die", None, false),
                (10, "tj-thermal", Some(96.0), false),
            ]
        );
        assert_eq!(zones[1].passive_c, Some(95.5));
        assert_eq!(zones[1].critical_c, Some(104.5));
    }

    #[test]
    fn many_zones_are_bounded_and_no_thermal_directory_is_no_note() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()), (Vec::new(), Vec::new()));
        for n in 0..(MAX_ZONES as u32 + 6) {
            zone(dir.path(), n, "z", "1000", &[]);
        }
        let (zones, notes) = read(dir.path());
        assert_eq!(zones.len(), MAX_ZONES);
        assert_eq!(zones.last().unwrap().zone, MAX_ZONES as u32 - 1);
        assert_eq!(notes, ["70 thermal zones: the first 64 shown"]);
    }
}
