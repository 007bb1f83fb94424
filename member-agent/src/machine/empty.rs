//! Empty: a new AppWrapper gets its component identities and is Suspended.

use lifeboat_api::appwrapper::constants::reasons as r;
use lifeboat_api::appwrapper::podsets::effective_pod_sets;
use lifeboat_api::appwrapper::{AppWrapperComponentStatus, AppWrapperPhase as Phase};

use super::Machine;
use super::names::{component_name, str_at};

impl Machine<'_, '_> {
    pub(super) fn initialize(&mut self) {
        let spec = self.input.spec;
        if self.d.status.component_status.len() != spec.components.len() {
            self.d.status.component_status = spec
                .components
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let template = &c.template;
                    AppWrapperComponentStatus {
                        name: component_name(template, self.input.uid, i),
                        kind: str_at(template, &["kind"]).unwrap_or_default(),
                        api_version: str_at(template, &["apiVersion"]).unwrap_or_default(),
                        pod_sets: effective_pod_sets(c),
                        conditions: Vec::new(),
                    }
                })
                .collect();
        }
        self.transition(Phase::Suspended, r::SUSPENDED, "");
    }
}
