//! Templates → bindings: the template watches ([`templates`]), the pure [`detector`] (kinds,
//! policy choice, binding spec), the [`binder`] (decide and write each binding, dispatch its
//! work), the seam to the scheduler ([`placement`]), and the template's
//! own status from its members ([`template_status`]).

pub mod binder;
pub mod detector;
pub mod placement;
pub mod template_status;
pub mod templates;
