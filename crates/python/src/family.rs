//! [`method_family!`]: one `#[pymethods]` body stamped out as several
//! Python methods that differ only in their name, docstring and a few
//! constant values (`put`/`upsert`, an alias of another method, the
//! methods that only raise). Each method keeps its own name, signature
//! and docstring, so the Python surface is the same as if every method
//! were written out.

/// Stamp one method template out once per listed method, all in one
/// `#[pymethods] impl` block of the class named after `for`. The
/// `#[pymethods]` attribute is the caller's, so the names pyo3 generates
/// share the caller's hygiene with the parameters (`*args` needs it).
///
/// ```ignore
/// method_family! {
///     #[pyo3(signature = (key, value, config=None))]
///     fn method(&self, py: Python<'_>, key: String, ...) -> PyResult<i64> {
///         self.write_value(Call::new(py, method), &key, ..., upsert)
///     }
///     #[pymethods] for MooncakeDistributedStore {
///         /// Store `value` under `key`; write-once.
///         put { upsert: false }
///         /// Insert or replace `key` with `value`.
///         upsert { upsert: true }
///     }
/// }
/// ```
///
/// In the template's body, the identifier after `fn` is the Python name of
/// the method being stamped (a `&'static str`), and each `name: value` of
/// the listed method is bound as a local of that name. The attributes
/// before `fn` (signature, lint allowances) apply to every method; a listed
/// method's own attributes (its docstring, its signature) and its own
/// parameters, `name(config: Cfg) { .. }`, follow the template's. The
/// methods mirror upstream's argument lists, however long.
macro_rules! method_family {
    (
        $(#[$($attr:tt)*])*
        fn $method:ident $(<$lt:lifetime>)? (&$self:ident $(, $arg:ident : $ty:ty)* $(,)?)
            -> $ret:ty $body:block
        $hash:tt $pymethods:tt for $class:ident {
            $(
                $(#[$($own_attr:tt)*])*
                $name:ident $(($($own_arg:ident : $own_ty:ty),* $(,)?))?
                { $($bind:ident : $val:expr),* $(,)? }
            )+
        }
    ) => {
        $crate::family::method_family!(
            @stamp [$hash $pymethods] $class []
            [$(
                [$(#[$($own_attr)*])*] $name [$($($own_arg: $own_ty),*)?] [$($bind = $val),*]
            )+]
            [$(#[$($attr)*])*] $method [$(<$lt>)?] $self [$($arg: $ty),*] $ret, $body
        );
    };
    // Every method stamped: emit them as one block.
    (@stamp [$($pymethods:tt)*] $class:ident [$($done:tt)*] [] $($template:tt)+) => {
        $($pymethods)*
        impl $class {
            $($done)*
        }
    };
    // Stamp the next method from the template.
    (
        @stamp [$($pymethods:tt)*] $class:ident [$($done:tt)*]
        [
            [$($own_attr:tt)*] $name:ident [$($own_arg:ident : $own_ty:ty),*]
            [$($bind:ident = $val:expr),*] $($rest:tt)*
        ]
        [$($attr:tt)*] $method:ident [$($lt:tt)*] $self:ident [$($arg:ident : $ty:ty),*]
        $ret:ty, $body:block
    ) => {
        $crate::family::method_family!(
            @stamp [$($pymethods)*] $class
            [
                $($done)*
                $($own_attr)*
                $($attr)*
                #[allow(clippy::too_many_arguments)]
                fn $name $($lt)* (&$self $(, $arg: $ty)* $(, $own_arg: $own_ty)*) -> $ret {
                    let $method: &'static str = stringify!($name);
                    $(let $bind = $val;)*
                    $body
                }
            ]
            [$($rest)*]
            [$($attr)*] $method [$($lt)*] $self [$($arg: $ty),*] $ret, $body
        );
    };
}

pub(crate) use method_family;
