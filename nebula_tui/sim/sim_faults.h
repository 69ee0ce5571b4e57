/*
 * faults.tsv, read by the simulated lab's C libraries (nvml_shim.c, cuda_shim.c): the
 * per-card faults, "index<TAB>key<TAB>value" lines, that fake_smi.update_faults writes
 * with faults.json. apply(index, key, value) is called for each line.
 */
#ifndef NEBULA_SIM_FAULTS_H
#define NEBULA_SIM_FAULTS_H
#include <limits.h>
#include <stdio.h>

static void read_faults(const char *sim_dir, void (*apply)(unsigned, const char *, const char *)) {
    char path[PATH_MAX], line[256];
    snprintf(path, sizeof path, "%s/faults.tsv", sim_dir);
    FILE *f = fopen(path, "r");
    if (!f) return;
    while (fgets(line, sizeof line, f)) {
        unsigned index;
        char key[64], value[64];
        if (sscanf(line, "%u\t%63s\t%63s", &index, key, value) == 3) apply(index, key, value);
    }
    fclose(f);
}

#endif
