//! Enums whose values are numeric codes on the wire (cell types, NACK reasons, reduction
//! operations, element types), declared once each: the code, the variant and the label
//! operators and metrics see sit on one line, and decoding (`from_u8`), the list of every
//! value (`ALL`) and the labels follow from it, so that a new value cannot be decodable
//! but unlabelled or listed but undecodable.

/// Declares a `#[repr(u8)]` enum of wire codes:
///
/// ```ignore
/// numeric_code! {
///     /// What it is.
///     pub enum Colour {
///         /// Doc of the value.
///         Red = 1 => "red",
///         Green = 2 => "green",
///     }
/// }
/// ```
///
/// gives `Colour::ALL` (declaration order), `from_u8`, `code`, `label` and `from_label`.
macro_rules! numeric_code {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $(
                $(#[doc = $doc:literal])*
                $variant:ident = $code:literal => $label:literal,
            )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u8)]
        $vis enum $name {
            $( $(#[doc = $doc])* $variant = $code, )*
        }

        impl $name {
            /// Every value, in the order declared.
            pub const ALL: [$name; [$($name::$variant),*].len()] = [$($name::$variant),*];

            /// The value wire code `v` names, if any.
            pub fn from_u8(v: u8) -> Option<$name> {
                match v {
                    $($code => Some($name::$variant),)*
                    _ => None,
                }
            }

            /// Its code on the wire.
            pub fn code(self) -> u8 {
                self as u8
            }

            /// The word operators, metrics and captures use for it.
            pub fn label(self) -> &'static str {
                match self {
                    $($name::$variant => $label,)*
                }
            }

            /// The value a [`label`](Self::label) names.
            pub fn from_label(label: &str) -> Option<$name> {
                Self::ALL.into_iter().find(|k| k.label() == label)
            }
        }
    };
}

pub(crate) use numeric_code;

#[cfg(test)]
mod tests {
    numeric_code! {
        /// A test enum.
        enum Colour {
            /// Sparse codes on purpose.
            Red = 1 => "red",
            Blue = 0x40 => "blue",
        }
    }

    #[test]
    fn codes_labels_and_the_list_agree() {
        assert_eq!(Colour::ALL, [Colour::Red, Colour::Blue]);
        for c in Colour::ALL {
            assert_eq!(Colour::from_u8(c.code()), Some(c));
            assert_eq!(Colour::from_label(c.label()), Some(c));
        }
        assert_eq!(Colour::from_u8(2), None);
        assert_eq!(Colour::from_label("green"), None);
        assert_eq!(Colour::Blue.code(), 0x40);
    }
}
