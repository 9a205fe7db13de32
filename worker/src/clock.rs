//! The worker's clock: milliseconds since the epoch, as the JavaScript runtime reads them
//! (workerd advances it only across I/O, which is all the worker needs to time).

/// Now, in milliseconds since the epoch.
pub(crate) fn now_ms() -> i64 {
    js_sys::Date::now() as i64
}
