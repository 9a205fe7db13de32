//! Our own cubecl kernels for the device model, where burn's general ones cost the most:
//! decoding runs a few rows at a time, and every launch has a fixed price (on a real GPU in a
//! browser, tens of microseconds), so one kernel per step beats a chain of elementwise ones.
//!
//! Each entry point answers `None` when its tensors do not live on a cubecl device (burn's
//! `flex` CPU backend) or are not laid out as the kernel reads them; the caller then composes
//! the same operation from burn's tensor operations.

use burn::backend::{BackendTensor, Cube, DispatchKindConversion, DispatchTensor};
use burn::tensor::{DType, Tensor};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::tensor::CubeTensor;
use cubecl::server::Handle;

pub(crate) mod attention;
pub(crate) mod elementwise;
pub mod matvec;
pub(crate) mod norm;

/// The cubecl primitive behind `t`, or `None` on another backend.
fn cube_primitive<const D: usize>(t: Tensor<D>) -> Option<BackendTensor<Cube>> {
    let dispatch: DispatchTensor = t.into_dispatch();
    <DispatchTensor as DispatchKindConversion<Cube>>::try_into_backend(dispatch).ok()
}

/// `t` as a contiguous f32 cubecl tensor, or `None` on another backend or dtype.
fn cube_f32<const D: usize>(t: &Tensor<D>) -> Option<CubeTensor> {
    match cube_primitive(t.clone())? {
        BackendTensor::Float(t) if t.dtype == DType::F32 => Some(into_contiguous(t)),
        _ => None,
    }
}

/// A fresh f32 tensor of `shape` on `like`'s device, and the handle a kernel writes it through.
fn empty_f32<const D: usize>(like: &CubeTensor, shape: [usize; D]) -> (CubeTensor, Handle) {
    let len: usize = shape.iter().product();
    let handle = like.client.empty(len * core::mem::size_of::<f32>());
    let tensor = CubeTensor::new_contiguous(
        like.client.clone(),
        like.device.clone(),
        shape.into(),
        handle.clone(),
        DType::F32,
    );
    (tensor, handle)
}

/// Wraps a kernel's output back into a burn tensor.
fn from_cube<const D: usize>(t: CubeTensor) -> Tensor<D> {
    Tensor::from_dispatch(
        <DispatchTensor as DispatchKindConversion<Cube>>::from_backend(BackendTensor::Float(t)),
    )
}
