//! `rtdeploy` for Python: open a robot's channels, publish, fetch the
//! latest message or every one since the last, wait for messages (iterate
//! or watch with a callback), and read a running controller's timing
//! report. For tools, tests and analysis: never real-time (the
//! interpreter allocates, collects and holds a global lock); a Python
//! process is a best-effort publisher and subscriber like any other.
//!
//! Message types are the classes `deploy gen --lang python` writes (a
//! `ctypes.Structure` with `TYPE_NAME`, `LAYOUT_HASH` and `dtype()`): a
//! channel checks the record at open, and one recording another type
//! refuses it, naming both.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use controller::channel::{Channel, Publisher, Subscriber};
use controller::shm::{TypeName, TypeRecord};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyType};

const PROC: &str = "/proc";

fn shm_dir(dir: Option<PathBuf>) -> PathBuf {
    dir.or_else(|| std::env::var_os("RTDEPLOY_SHM_DIR").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("/dev/shm/rtdeploy"))
}

/// The error and its causes, as one line.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut c = e.source();
    while let Some(x) = c {
        s.push_str(&format!(": {x}"));
        c = x.source();
    }
    s
}

fn err(e: impl std::error::Error + 'static) -> PyErr {
    PyRuntimeError::new_err(chain(&e))
}

/// The record of a generated message class.
fn record(py: Python<'_>, ty: &Bound<'_, PyType>) -> PyResult<TypeRecord> {
    let name: String = ty
        .getattr("TYPE_NAME")
        .and_then(|v| v.extract())
        .map_err(|_| {
            PyTypeError::new_err("a message type has TYPE_NAME (deploy gen --lang python)")
        })?;
    let hash: u64 = ty
        .getattr("LAYOUT_HASH")
        .and_then(|v| v.extract())
        .map_err(|_| {
            PyTypeError::new_err("a message type has LAYOUT_HASH (deploy gen --lang python)")
        })?;
    let ctypes = py.import("ctypes")?;
    let size: u64 = ctypes.call_method1("sizeof", (ty,))?.extract()?;
    let align: u64 = ctypes.call_method1("alignment", (ty,))?.extract()?;
    if name.is_empty() || name.len() > TypeName::MAX {
        return Err(PyValueError::new_err(format!(
            "TYPE_NAME `{name}`: 1 to {} bytes",
            TypeName::MAX
        )));
    }
    if !matches!(align, 1 | 2 | 4 | 8) {
        return Err(PyValueError::new_err(format!(
            "{name}: alignment {align}; a channel's type is 1, 2, 4 or 8-aligned"
        )));
    }
    Ok(TypeRecord {
        name: TypeName::new(&name),
        size,
        align,
        layout_hash: hash,
    })
}

/// A channel of the robot, opened by name.
#[pyclass(name = "Channel", module = "rtdeploy", unsendable)]
struct Chan {
    ch: Channel,
}

#[pymethods]
impl Chan {
    /// Opens channel `name` (`/demo/chatter`) in `shm_dir` (default: the
    /// supervisor's `RTDEPLOY_SHM_DIR`, else `/dev/shm/rtdeploy`).
    #[new]
    #[pyo3(signature = (name, shm_dir=None))]
    fn new(name: &str, shm_dir: Option<PathBuf>) -> PyResult<Chan> {
        let ch = Channel::open(&self::shm_dir(shm_dir), name).map_err(err)?;
        Ok(Chan { ch })
    }

    #[getter]
    fn name(&self) -> String {
        self.ch.name().to_string()
    }

    /// The largest message it carries, in bytes.
    #[getter]
    fn max_size(&self) -> u64 {
        self.ch.geometry().max_payload()
    }

    /// A publisher of `type` (a generated message class), bound to it.
    fn publisher(&self, py: Python<'_>, r#type: &Bound<'_, PyType>) -> PyResult<Pub> {
        let t = record(py, r#type)?;
        self.ch.bind_record(&t).map_err(err)?;
        let p = self.ch.publisher(Path::new(PROC)).map_err(err)?;
        Ok(Pub {
            p,
            size: t.size as usize,
            ty: r#type.clone().unbind(),
        })
    }

    /// A subscriber of `type`, reading from the next message published.
    fn subscriber(&self, py: Python<'_>, r#type: &Bound<'_, PyType>) -> PyResult<Sub> {
        let t = record(py, r#type)?;
        self.ch.bind_record(&t).map_err(err)?;
        let s = self.ch.subscriber(Path::new(PROC)).map_err(err)?;
        Ok(Sub {
            s,
            size: t.size as usize,
            ty: r#type.clone().unbind(),
        })
    }
}

/// Publishes messages of one type.
#[pyclass(name = "Publisher", module = "rtdeploy", unsendable)]
struct Pub {
    p: Publisher,
    size: usize,
    ty: Py<PyType>,
}

#[pymethods]
impl Pub {
    /// Publishes `msg`: an instance of the type, or its bytes.
    fn publish(&mut self, py: Python<'_>, msg: &Bound<'_, PyAny>) -> PyResult<u64> {
        let bytes: Vec<u8> = if let Ok(b) = msg.cast::<PyBytes>() {
            b.as_bytes().to_vec()
        } else {
            let ty = self.ty.bind(py);
            if !msg.is_instance(ty)? {
                return Err(PyTypeError::new_err(format!(
                    "expected a {} or its bytes",
                    ty.name()?
                )));
            }
            py.import("builtins")?
                .call_method1("bytes", (msg,))?
                .extract()?
        };
        if bytes.len() != self.size {
            return Err(PyValueError::new_err(format!(
                "{} bytes; the type is {}",
                bytes.len(),
                self.size
            )));
        }
        let p = self.p.publish(&bytes).map_err(err)?;
        Ok(p.index)
    }

    /// Messages published by this publisher.
    #[getter]
    fn published(&self) -> u64 {
        self.p.published()
    }
}

/// Reads messages of one type, in order or the latest.
#[pyclass(name = "Subscriber", module = "rtdeploy", unsendable)]
struct Sub {
    s: Subscriber,
    size: usize,
    ty: Py<PyType>,
}

impl Sub {
    fn make(&self, py: Python<'_>, data: &[u8]) -> PyResult<Py<PyAny>> {
        if data.len() != self.size {
            return Err(PyValueError::new_err(format!(
                "a message of {} bytes, not the type's {}",
                data.len(),
                self.size
            )));
        }
        Ok(self
            .ty
            .bind(py)
            .call_method1("from_buffer_copy", (PyBytes::new(py, data),))?
            .unbind())
    }

    fn next_one(&mut self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        let bytes = match self.s.next_message().map_err(err)? {
            Some(m) => m.data.to_vec(),
            None => return Ok(None),
        };
        self.make(py, &bytes).map(Some)
    }
}

#[pymethods]
impl Sub {
    /// The newest message not read yet, or None.
    fn latest(&mut self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        let bytes = match self.s.latest().map_err(err)? {
            Some(m) => m.data.to_vec(),
            None => return Ok(None),
        };
        self.make(py, &bytes).map(Some)
    }

    /// The next message in order, or None.
    fn next(&mut self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        self.next_one(py)
    }

    /// Every message since the last read, in order (at most `limit`).
    #[pyo3(signature = (limit=100_000))]
    fn since<'py>(&mut self, py: Python<'py>, limit: usize) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        while out.len() < limit {
            match self.next_one(py)? {
                Some(m) => out.append(m)?,
                None => break,
            }
        }
        Ok(out)
    }

    /// The messages since the last read as one numpy structured array of
    /// the type's `dtype()` (numpy imported here, when asked).
    #[pyo3(signature = (limit=100_000))]
    fn since_array<'py>(&mut self, py: Python<'py>, limit: usize) -> PyResult<Bound<'py, PyAny>> {
        let mut all = Vec::new();
        let mut n = 0;
        while n < limit {
            match self.s.next_message().map_err(err)? {
                Some(m) if m.data.len() == self.size => {
                    all.extend_from_slice(m.data);
                    n += 1;
                }
                Some(_) => continue,
                None => break,
            }
        }
        let dtype = self.ty.bind(py).call_method0("dtype")?;
        py.import("numpy")?
            .call_method1("frombuffer", (PyBytes::new(py, &all), dtype))
    }

    /// Waits up to `timeout` seconds for a message (the channel's futex,
    /// the interpreter's lock released); True when one is there.
    #[pyo3(signature = (timeout=1.0))]
    fn wait(&mut self, py: Python<'_>, timeout: f64) -> PyResult<bool> {
        if self.s.has_new() {
            return Ok(true);
        }
        let t = Duration::from_secs_f64(timeout.clamp(0.0, 3600.0));
        // The wait touches only this subscriber, no Python object: the
        // interpreter's lock is released meanwhile.
        let s = &mut self.s;
        py.detach(move || s.wait(Some(t)));
        Ok(self.s.has_new())
    }

    /// Calls `callback(message)` for each message as it comes, until
    /// `count` messages (None: for ever) or `timeout` seconds (None: no
    /// limit); returns how many. Ctrl-C stops it.
    #[pyo3(signature = (callback, count=None, timeout=None))]
    fn watch(
        &mut self,
        py: Python<'_>,
        callback: &Bound<'_, PyAny>,
        count: Option<u64>,
        timeout: Option<f64>,
    ) -> PyResult<u64> {
        let until = timeout.map(|t| Instant::now() + Duration::from_secs_f64(t.clamp(0.0, 1e7)));
        let mut n = 0;
        loop {
            while let Some(m) = self.next_one(py)? {
                callback.call1((m,))?;
                n += 1;
                if count.is_some_and(|c| n >= c) {
                    return Ok(n);
                }
            }
            if until.is_some_and(|u| Instant::now() >= u) {
                return Ok(n);
            }
            py.check_signals()?;
            self.wait(py, 0.1)?;
        }
    }

    /// Messages overwritten before this subscriber read them.
    #[getter]
    fn lost(&self) -> u64 {
        self.s.lost()
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// Iterating waits for each next message (Ctrl-C stops it).
    fn __next__(&mut self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        loop {
            if let Some(m) = self.next_one(py)? {
                return Ok(m);
            }
            py.check_signals()?;
            self.wait(py, 0.1)?;
        }
    }
}

/// The timing report `process` published last (what `deploy status`
/// shows), as a dict; None when it has published none yet.
#[pyfunction]
#[pyo3(signature = (process, shm_dir=None))]
fn timing_report(
    py: Python<'_>,
    process: &str,
    shm_dir: Option<PathBuf>,
) -> PyResult<Option<Py<PyAny>>> {
    match controller::timing_report::read_latest(&self::shm_dir(shm_dir), process).map_err(err)? {
        None => Ok(None),
        Some(r) => {
            let text = serde_json::to_string(&r).map_err(err)?;
            Ok(Some(
                py.import("json")?.call_method1("loads", (text,))?.unbind(),
            ))
        }
    }
}

#[pymodule]
fn rtdeploy(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Chan>()?;
    m.add_class::<Pub>()?;
    m.add_class::<Sub>()?;
    m.add_function(wrap_pyfunction!(timing_report, m)?)?;
    m.add(
        "__doc__",
        "rtdeploy's channels and timing reports from Python: for tools, tests and analysis, never real-time.",
    )?;
    m.add("REAL_TIME", false)?;
    Ok(())
}
