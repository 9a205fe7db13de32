//! A timer for streams. `worker::Delay` keeps the waker of its first poll only; a response
//! stream is polled by a fresh task on every JavaScript `pull`, so that waker is stale by the
//! time the timer fires and the stream never hears it. This one wakes whoever polled last.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use wasm_bindgen::JsCast;
use wasm_bindgen::JsValue;
use wasm_bindgen::closure::Closure;

/// Fires once, `after` its creation.
pub(crate) struct Deadline {
    fired: Rc<Cell<bool>>,
    waker: Rc<RefCell<Option<Waker>>>,
    timeout_id: JsValue,
    // Kept alive until the timer fires or is cleared.
    _callback: Closure<dyn FnMut()>,
}

fn global_function(name: &str) -> Result<js_sys::Function, JsValue> {
    js_sys::Reflect::get(&js_sys::global(), &JsValue::from_str(name))?.dyn_into()
}

impl Deadline {
    /// Starts the timer.
    pub(crate) fn after(delay: Duration) -> worker::Result<Self> {
        let fired = Rc::new(Cell::new(false));
        let waker: Rc<RefCell<Option<Waker>>> = Rc::new(RefCell::new(None));
        let callback = {
            let (fired, waker) = (fired.clone(), waker.clone());
            Closure::<dyn FnMut()>::new(move || {
                fired.set(true);
                if let Some(w) = waker.borrow_mut().take() {
                    w.wake();
                }
            })
        };
        let ms = delay.as_millis().min(i32::MAX as u128) as f64;
        let timeout_id = global_function("setTimeout")?.call2(
            &JsValue::UNDEFINED,
            callback.as_ref(),
            &JsValue::from_f64(ms),
        )?;
        Ok(Deadline {
            fired,
            waker,
            timeout_id,
            _callback: callback,
        })
    }

    /// Ready once the time is up; until then the caller is woken when it is.
    pub(crate) fn poll(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.fired.get() {
            return Poll::Ready(());
        }
        *self.waker.borrow_mut() = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl Drop for Deadline {
    fn drop(&mut self) {
        if !self.fired.get()
            && let Ok(clear) = global_function("clearTimeout")
        {
            let _ = clear.call1(&JsValue::UNDEFINED, &self.timeout_id);
        }
    }
}
