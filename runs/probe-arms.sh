# Sourced by runs/cispo-vault.sh and runs/cispo-sets.sh: `run NAME FLAGS...` runs one arm of probes/vault/cispo_vault.py
# into $OUT/NAME (its log $OUT/NAME.log), skipped unless ONLY is unset or names it; side by side with PARALLEL=1
# (then `wait` for them), else one after another. FLAGS are added to every arm.
arm() {   # NAME, then the probe's and train.py's flags
    local name=$1; shift
    python -m probes.vault.cispo_vault --out "$OUT/$name" "$@" ${FLAGS:-} > "$OUT/$name.log" 2>&1
}
run() {
    case " ${ONLY:-$1} " in *" $1 "*) ;; *) return 0 ;; esac
    if [ "${PARALLEL:-0}" = 1 ]; then arm "$@" & else arm "$@"; fi
}
