//! Unix seconds as a UTC calendar date and time, for the dates the tools
//! print and write (no time zone database needed: UTC only).

/// A UTC date and time of day.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Utc {
    pub year: i64,
    pub month: i64,
    pub day: i64,
    pub hour: u64,
    pub minute: u64,
    pub second: u64,
}

/// The UTC date and time `secs` seconds after 1970-01-01T00:00:00Z
/// (proleptic Gregorian calendar; Howard Hinnant's days-to-civil
/// algorithm).
pub fn utc(secs: u64) -> Utc {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    Utc {
        year: yoe + era * 400 + i64::from(month <= 2),
        month,
        day,
        hour: rem / 3600,
        minute: rem / 60 % 60,
        second: rem % 60,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoch_leap_day_and_end_of_year() {
        let t = |y, mo, d, h, mi, s| Utc {
            year: y,
            month: mo,
            day: d,
            hour: h,
            minute: mi,
            second: s,
        };
        assert_eq!(utc(0), t(1970, 1, 1, 0, 0, 0));
        assert_eq!(utc(951_782_400 + 3661), t(2000, 2, 29, 1, 1, 1));
        assert_eq!(utc(1_704_067_199), t(2023, 12, 31, 23, 59, 59));
    }
}
