package ruleplatform.keyed;

/** An output of a velocity or correlation step for one row. */
final class Emit {
    final Ev row;
    Double aggValue;
    String ctxJson;
    Double metricValue;
    String ctxRecord;
    Double ctxNum;

    Emit(Ev row) {
        this.row = row;
    }
}
