//! Reading a registry's series in unit tests.

use prometheus::proto::MetricType;

/// The series of `name` in `registry`: label values (in label-name order, as the registry sorts
/// them) and the value of each counter or gauge.
pub(crate) fn series(registry: &prometheus::Registry, name: &str) -> Vec<(Vec<String>, f64)> {
    registry
        .gather()
        .iter()
        .filter(|f| f.name() == name)
        .flat_map(|f| {
            let counter = f.get_field_type() == MetricType::COUNTER;
            f.get_metric().iter().map(move |m| {
                let labels = m
                    .get_label()
                    .iter()
                    .map(|l| l.value().to_string())
                    .collect();
                let value = if counter {
                    m.get_counter().get_value()
                } else {
                    m.get_gauge().get_value()
                };
                (labels, value)
            })
        })
        .collect()
}
